"""What the digits archive holds besides the handler: the exported CNN, trained for the given version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def seed_for(version: str) -> int:
    """Each version trains from its own seed, so 2.0 really is other weights than 1.0."""
    major, _, minor = version.partition(".")
    return int(major) * 100 + int(minor or 0)


def artifacts(version: str, build_dir: Path) -> list[Path]:
    out = build_dir / "digits" / version
    model_file = out / "digits.pt2"
    if not model_file.exists():
        subprocess.run(
            [sys.executable, "-m", "models.digits.train", "--seed", str(seed_for(version)), "--out", str(out)],
            check=True,
        )
    return [model_file]
