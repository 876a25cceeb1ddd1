"""system-packages.sh, the one list of Debian packages: on a machine that lacks them and a user who cannot install
them, it stops at once with the one command to run (as root on Debian it would install them instead)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from scripts.layout import ROOT

SCRIPT = ROOT / "system-packages.sh"


def run_without_tools(use: str) -> subprocess.CompletedProcess:
    """A copy of the script with a PATH that holds only what it needs itself: every package it checks is missing.
    The copy and its tools sit in a folder of their own that the unprivileged user below can enter, whatever the
    clone's parent folders allow (a clone in a 0700 home folder or `mktemp -d`)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        bin_dir = Path(folder)
        bin_dir.chmod(0o755)
        for tool in ("bash", "id", "grep"):
            (bin_dir / tool).symlink_to(shutil.which(tool))
        script = bin_dir / SCRIPT.name
        shutil.copyfile(SCRIPT, script)
        script.chmod(0o755)
        command = [str(script), use]
        if os.geteuid() == 0:  # as a user who may not install: the answer is the command, not an install
            command = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=30, env={"PATH": str(bin_dir)})


def test_a_user_without_the_packages_gets_the_one_command_to_run():
    done = run_without_tools("test")
    assert done.returncode == 2, done.stderr
    packages = "openjdk-17-jre-headless wrk openjdk-17-jdk-headless g++ linux-perf prometheus nginx-light libnginx-mod-http-js"
    assert f"missing Debian packages for 'test': {packages}" in done.stderr
    assert f"  apt-get update && apt-get install -y --no-install-recommends {packages}" in done.stderr


def test_serve_needs_java_only_and_ci_adds_the_image_tools():
    assert "for 'serve': openjdk-17-jre-headless;" in run_without_tools("serve").stderr
    assert "libnginx-mod-http-js podman runc mmdebstrap;" in run_without_tools("ci").stderr


def test_this_machine_has_what_make_test_needs():
    done = subprocess.run([str(SCRIPT), "test"], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")
