"""The digits CNN where only torch is (models/portable.py): its trained weights as a plain .npz, rebuilt as DigitsNet,
exported with the archive's batch axis; checked on the 360 held-out rows."""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from models.digits.network import DigitsNet
from models.portable import Portable, load_weights, save_weights

WEIGHTS = "weights.npz"


class Digits(Portable):
    name = stem = "digits"
    input_names = ("grids",)
    output_name = "probabilities"
    max_batch = 1 << 16  # models/digits/train.py MAX_EXPORT_BATCH
    # The probabilities as the CPU's on the same weights; every label the same. fp32 as the check's goal; bf16 as
    # the CPU's format tests hold it (docs/formats.md); fp16 (CUDA only) between the two.
    agreement = {
        "fp32": {"equal": ["label"], "close": {"scores": 1e-4}},
        "bf16": {"equal": ["label"], "close": {"scores": 2e-2}},
        "fp16": {"equal": ["label"], "close": {"scores": 1e-2}},
    }
    # The export's own maximum in one micro-batch: under a cap sized from a 1/8 pass it must be split.
    oom_rows = 1 << 16

    def items(self) -> list[Any]:
        from models.digits.samples import held_out

        grids, _ = held_out()
        return [grid.tolist() for grid in grids]

    def write(self, folder: Path, items: Sequence[Any]) -> None:
        from models.digits.formats import eager_from_program
        from scripts.layout import MODEL_STORE

        with tempfile.TemporaryDirectory() as staging, zipfile.ZipFile(MODEL_STORE / "digits.mar") as mar:
            program = Path(staging) / "digits.pt2"
            program.write_bytes(mar.read("digits.pt2"))  # the served archive's trained weights
            save_weights(folder / WEIGHTS, eager_from_program(program).state_dict())

    def eager(self, folder: Path) -> DigitsNet:
        model = DigitsNet()
        model.load_state_dict(load_weights(folder / WEIGHTS), strict=True)
        return model.eval()

    def example(self, device: torch.device):
        batch = torch.export.Dim("batch", min=1, max=self.max_batch)
        return (torch.zeros(4, 1, 8, 8, device=device),), [{0: batch}]


PORTABLE = Digits()
