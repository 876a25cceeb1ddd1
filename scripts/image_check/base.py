"""A Debian base image built here (no image registry is reachable from these machines): mmdebstrap writes a
minimal bookworm with Python 3.11 to a tar, cached under build/container/, and `podman import` makes it an image."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from scripts.image_check.podman import ContainerError, Podman, require_tools

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_IMAGE = f"localhost/unified-serve-base:{SUITE}"
BUILD_TIMEOUT_S = 1800


def ensure_base(podman: Podman, cache: Path) -> float:
    """BASE_IMAGE present (built and imported when missing); the seconds that took (0 when cached)."""
    started = time.monotonic()
    tar = cache / f"base-{SUITE}.tar"
    if not tar.exists():
        build_tar(tar)
    stamp = cache / f"base-{SUITE}.imported"
    if not podman.image_exists(BASE_IMAGE) or not stamp.exists() or stamp.stat().st_mtime < tar.stat().st_mtime:
        podman.run("import", str(tar), BASE_IMAGE, timeout=600)
        stamp.touch()
        return time.monotonic() - started
    return 0.0


def build_tar(tar: Path) -> None:
    require_tools("mmdebstrap")
    tar.parent.mkdir(parents=True, exist_ok=True)
    partial = tar.with_suffix(".partial.tar")
    command = ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(partial)]
    print(f"building the base: {' '.join(command)}", flush=True)
    try:
        subprocess.run(command, check=True, timeout=BUILD_TIMEOUT_S, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        raise ContainerError(f"mmdebstrap took over {BUILD_TIMEOUT_S}s") from None
    except subprocess.CalledProcessError as error:
        raise ContainerError(f"mmdebstrap failed ({error.returncode}): {error.stderr.strip()[-2000:]}") from None
    partial.rename(tar)
