"""The trained digits CNN in another serving format, converted from its torch.export program (no retraining).

    python -m models.digits.formats --program build/digits/1.0/digits.pt2 --format onnx [--precision fp32]

Writes the file beside the program (digits.onnx, digits.ts, digits.aoti.pt2, digits.bf16.aoti.pt2)
after checking it against the eager CNN at batch sizes 1, 7 and 300 (probabilities within 1e-5;
5e-2 for a bf16 file).
"""

from __future__ import annotations

from pathlib import Path

import torch

from models import export_formats
from models.digits.network import DigitsNet
from models.digits.train import MAX_EXPORT_BATCH
from scripts import cli

INPUT_NAMES = ("grids",)
OUTPUT_NAME = "probabilities"


def eager_from_program(program_path: Path) -> DigitsNet:
    """The eager CNN with the exported program's weights (torch.export keeps them as raw tensors)."""
    model = DigitsNet()
    model.load_state_dict(torch.export.load(str(program_path)).state_dict, strict=True)
    return model.eval()


def convert(program_path: Path, fmt: str, precision: str = "fp32") -> Path:
    out = program_path.with_name(export_formats.file_name("digits", fmt, precision))
    if fmt == "export":
        return program_path
    eager = eager_from_program(program_path)
    batch = torch.export.Dim("batch", min=1, max=MAX_EXPORT_BATCH)
    export_formats.write(
        fmt, precision, eager, program_path, (torch.zeros(4, 1, 8, 8),), [{0: batch}], (INPUT_NAMES, OUTPUT_NAME), out
    )
    from handlers.model_files import compiled_precision, load_program

    generator = torch.Generator().manual_seed(0)
    cases = [(torch.rand(rows, 1, 8, 8, generator=generator) * 16,) for rows in (1, 7, 300)]
    limit = 5e-2 if compiled_precision(out) else 1e-5
    worst = export_formats.verify(
        lambda path: load_program(path, torch.device("cpu")),
        out,
        eager,
        cases,
        lambda a, b: float((a - b).abs().max()),
        limit,
    )
    print(f"digits {fmt}/{precision} -> {out} (largest probability difference to eager {worst:.1e})")
    return out


if __name__ == "__main__":
    cli.run(lambda: export_formats.convert_command(__doc__, "the trained digits.pt2", convert))
