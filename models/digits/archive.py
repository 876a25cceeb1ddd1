"""What the digits archive holds besides the handler: the exported CNN, trained for the given version,
in the serving format chosen (model-config.yaml's `format`, or make archive FORMAT=...)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from models import export_formats

CODE = [Path(__file__).resolve().parent / "formats.py", Path(export_formats.__file__).resolve()]


def seed_for(version: str) -> int:
    """Each version trains from its own seed, so 2.0 really is other weights than 1.0."""
    major, _, minor = version.partition(".")
    return int(major) * 100 + int(minor or 0)


def artifacts(version: str, build_dir: Path, fmt: str = "export", precision: str = "fp32") -> list[Path]:
    """[the model file] for `fmt` at `precision`: digits.pt2 (trained once per version), then converted
    from it (digits.ts, digits.onnx, digits.aoti.pt2, ...), each cached beside it until its code changes."""
    out = build_dir / "digits" / version
    program = out / "digits.pt2"
    if not program.exists():
        subprocess.run(
            [sys.executable, "-m", "models.digits.train", "--seed", str(seed_for(version)), "--out", str(out)],
            check=True,
        )
    model_file = out / export_formats.file_name("digits", fmt, precision)
    if model_file != program and export_formats.stale(model_file, [program, *CODE]):
        subprocess.run(
            [sys.executable, "-m", "models.digits.formats", "--program", str(program), "--format", fmt, "--precision", precision],
            check=True,
        )
    return [model_file]
