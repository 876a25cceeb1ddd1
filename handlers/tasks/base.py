"""The hooks a model kind implements; the core drives them and never looks inside a row."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence

import torch

from handlers.settings import HandlerSettings


class Task(Protocol):
    """decode -> collate -> forward -> unbatch, LitServe-style. Rows are opaque to the core."""

    name: str

    def __init__(self, settings: HandlerSettings) -> None: ...

    def load_model(self, model_path: Path, device: torch.device) -> Any:
        """Load the exported model file (no pickle) onto `device`, ready for forward()."""

    def decode_raw(self, body: bytes | str) -> Any:
        """One raw request body -> one row; raise RequestError naming what is wrong."""

    def decode_instance(self, item: Any) -> Any:
        """One JSON instance -> one row; raise RequestError naming what is wrong."""

    def collate(self, rows: Sequence[Any], pad_to: int | None) -> Any:
        """Rows -> a CPU batch (a tensor or dict of tensors). `pad_to` fixes the batch's shape (deterministic mode)."""

    def forward(self, model: Any, batch: Any) -> torch.Tensor:
        """Run the model on a device batch; return one output row per input row (padding included)."""

    def unbatch(self, outputs: torch.Tensor, rows: Sequence[Any]) -> list[Any]:
        """Float32 CPU outputs for `rows` -> one JSON-ready result per row."""

    def row_cost(self, row: Any) -> int:
        """Relative size of a row; rows are grouped by it (e.g. token count) before micro-batching."""
