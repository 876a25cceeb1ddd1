"""Build model_store/<model>[-<version>].mar with torch-model-archiver.

    python -m scripts.archive.build --model digits --version 2.0

The archive holds the handler entry point at its root, the `handlers` package, the model's
model-config.yaml and the files its models/<model>/archive.py produces (trained and exported here).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts import cli
from scripts.errors import ArchiveError
from scripts.layout import BUILD, MODEL_STORE, ROOT

DEFAULT_VERSION = "1.0"


def archive_name(model: str, version: str) -> str:
    """digits.mar for the default version, digits-2.0.mar for others, so both can sit in one store."""
    return model if version == DEFAULT_VERSION else f"{model}-{version}"


def build(model: str, version: str, model_store: Path, build_dir: Path) -> Path:
    model_dir = ROOT / "models" / model
    if not (model_dir / "archive.py").exists():
        known = sorted(p.parent.name for p in (ROOT / "models").glob("*/archive.py"))
        raise ArchiveError(f"unknown model {model!r}; known models: {', '.join(known)}")
    files = importlib.import_module(f"models.{model}.archive").artifacts(version, build_dir)
    model_store.mkdir(parents=True, exist_ok=True)
    name = archive_name(model, version)
    with tempfile.TemporaryDirectory() as staging:
        extra = Path(staging) / "extra"
        # The archiver copies a folder's *contents*: stage one holding handlers/ so the package survives.
        shutil.copytree(ROOT / "handlers", extra / "handlers", ignore=shutil.ignore_patterns("__pycache__"))
        for file in files:
            shutil.copy2(file, extra / file.name)
        command = [
            str(Path(sys.executable).parent / "torch-model-archiver"),
            "--model-name",
            model,
            "--version",
            version,
            "--handler",
            str(ROOT / "handlers" / "torchserve_handler.py"),
            "--extra-files",
            str(extra),
            "--config-file",
            str(model_dir / "model-config.yaml"),
            "--export-path",
            staging,
            "--force",
        ]
        subprocess.run(command, check=True)
        # The manifest keeps the model's own name; only the file name carries the version.
        target = model_store / f"{name}.mar"
        shutil.move(Path(staging) / f"{model}.mar", target)
    print(f"built {target} ({target.stat().st_size / 1e6:.1f} MB, {model} version {version})")
    return target


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--model", default="digits")
    parser.add_argument("--version", default=DEFAULT_VERSION)
    parser.add_argument("--model-store", type=Path, default=MODEL_STORE)
    parser.add_argument("--build-dir", type=Path, default=BUILD)
    args = parser.parse_args()
    build(args.model, args.version, args.model_store, args.build_dir)
    return 0


if __name__ == "__main__":
    cli.run(main)
