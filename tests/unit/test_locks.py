"""The dependency locks (locks/, `make lock`): every package pinned with its sha256, every direct pin of the
requirements files locked at the same version, and every venv recipe installing from a lock with hash checking."""

from __future__ import annotations

import re
import subprocess

import pytest

from scripts.layout import ROOT

LOCKS = ROOT / "locks"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\\;]+)")


def pins(path) -> dict[str, str]:
    """name -> version of every `name==version` line of a requirements or lock file (names normalised)."""
    found = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line)
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return found


def locked_entries(path) -> list[tuple[str, list[str]]]:
    """(requirement line, its --hash options) for each package of a uv lock file."""
    entries: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if PIN.match(line):
            entries.append((line, []))
        elif line.strip().startswith("--hash=") and entries:
            entries[-1][1].append(line.strip().rstrip(" \\"))
        elif line.strip() and not line.lstrip().startswith("#"):
            raise AssertionError(f"{path.name}: unexpected line {line!r}")
    return entries


@pytest.mark.parametrize(
    "lock",
    sorted(path.name for path in LOCKS.glob("*.txt")),
)
def test_every_locked_package_is_pinned_with_a_sha256(lock):
    entries = locked_entries(LOCKS / lock)
    assert len(entries) >= (1 if lock in ("pip.txt", "reference.txt") else 4)
    for requirement, hashes in entries:
        assert hashes, f"{lock}: {requirement} has no hash"
        assert all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", option) for option in hashes), requirement


@pytest.mark.parametrize(
    ("requirements", "lock"),
    [
        ("requirements.txt", "tools-cpu.txt"),
        ("requirements-serving.txt", "tools-cpu.txt"),
        ("requirements-serving.txt", "serving-cpu.txt"),
        ("requirements-serving.txt", "serving-cuda.txt"),
        ("requirements-serving-nodeps.txt", "serving-nodeps.txt"),
        ("requirements-peer-pytriton.txt", "peer-pytriton.txt"),
        ("requirements-reference.txt", "reference.txt"),
    ],
)
def test_every_direct_pin_is_locked_at_its_version(requirements, lock):
    """A requirements file edited without `make lock` fails here: the lock would install something else."""
    wanted, locked = pins(ROOT / requirements), pins(LOCKS / lock)
    assert wanted
    for name, version in wanted.items():
        assert name in locked, f"{name}=={version} ({requirements}) is not in locks/{lock}: run `make lock`"
        assert locked[name].split("+")[0] == version, f"{name}: {requirements} pins {version}, locks/{lock} {locked[name]}"


def test_the_cpu_locks_take_torchs_cpu_wheel_and_the_image_default_pypis_cuda_build():
    assert pins(LOCKS / "serving-cpu.txt")["torch"] == pins(LOCKS / "tools-cpu.txt")["torch"] == "2.13.0+cpu"
    cuda = pins(LOCKS / "serving-cuda.txt")
    assert cuda["torch"] == "2.13.0" and any(name.startswith("nvidia-cublas") for name in cuda)


def test_the_serving_and_tools_locks_agree_on_every_shared_package():
    serving, tools = pins(LOCKS / "serving-cpu.txt"), pins(LOCKS / "tools-cpu.txt")
    assert set(serving) <= set(tools)
    assert {name: tools[name] for name in serving} == serving


def test_the_nodeps_lock_holds_only_its_requirements():
    """Installed with --no-deps: what nvgpu and tokenizers declare but serving never imports stays out."""
    assert set(pins(LOCKS / "serving-nodeps.txt")) == set(pins(ROOT / "requirements-serving-nodeps.txt"))


def test_the_reference_lock_holds_torchvision_alone_and_no_other_lock_has_it():
    """torchvision beside the CPU torch fails to import (requirements-reference.txt): installed into the venv it would
    break transformers, which imports it when it finds it; only the reference's folder holds it."""
    assert set(pins(LOCKS / "reference.txt")) == {"torchvision"}
    for lock in sorted(LOCKS.glob("*.txt")):
        assert lock.name == "reference.txt" or "torchvision" not in pins(lock), lock.name


@pytest.mark.parametrize(("target", "lock"), [("venv", "locks/tools-cpu.txt"), ("venv-serving", "locks/serving-cpu.txt")])
def test_each_venv_recipe_installs_its_lock_with_hash_checking(tmp_path, target, lock):
    """`make -n` on an empty venv path: the commands the recipe would run."""
    shown = subprocess.run(
        ["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    installs = [line for line in shown.splitlines() if " -m pip install " in line]
    assert len(installs) == (4 if target == "venv" else 3), shown
    assert all("--require-hashes" in line for line in installs), installs
    assert "-r locks/pip.txt" in installs[0]
    assert f"-r {lock}" in installs[1] and "--no-deps -r locks/serving-nodeps.txt" in installs[2]
    if target == "venv":  # the classifier's reference: torchvision outside the venv's import path
        assert f"--no-deps --upgrade --target {tmp_path / 'venv'}/reference -r locks/reference.txt" in installs[3]


def test_no_lock_installs_the_deprecated_pynvml_shim():
    """nvgpu's `pynvml` module comes from nvidia-ml-py: the `pynvml` package is a shim whose import hook warns on
    every `import torch` (a venv made from an older lock loses it in the venv recipes)."""
    for lock in sorted(LOCKS.glob("*.txt")):
        assert "pynvml" not in pins(lock), lock.name
    assert "nvidia-ml-py" in pins(LOCKS / "serving-nodeps.txt")
    assert "--yes pynvml" in (ROOT / "Makefile").read_text()
