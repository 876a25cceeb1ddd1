"""The hooks a model kind implements, and how its typed options are read; the core never looks inside a row."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from handlers.errors import SettingsError
from handlers.settings import CORE_KEYS


class Task(Protocol):
    """decode -> collate -> forward -> unbatch, LitServe-style. Rows are opaque to the core."""

    name: ClassVar[str]
    # The task's own handler: keys, as a frozen dataclass whose fields have defaults.
    Options: ClassVar[type]
    # Media type prefixes a raw body may be sent as ("image/", "text/", ...); another gets a 415 before decoding.
    raw_media: ClassVar[tuple[str, ...]]

    def __init__(self, options: Any) -> None: ...

    def load_model(self, model_path: Path, device: torch.device) -> Any:
        """Load the exported model file (no pickle) onto `device`, ready for forward()."""

    # Optional: `for_request() -> Task`, the decoders for one request, for limits that span its items (the digits
    # task's pixel budget); InferenceCore.decode calls it once per request when the task has it.

    # Optional: `decode_many(items) -> list | None`, every JSON instance of a request at once (vectorised), giving
    # exactly the rows decode_instance gives item by item, or None to let the core decode item by item (it does
    # whenever an item is not of the plain kind, so errors name the first bad item as before).

    # Optional: `GRAPH_EXAMPLE_ITEM`, a JSON instance decoded once to capture CUDA graphs (InferenceCore.capture_graphs).

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


OptionsT = TypeVar("OptionsT")


def read_options(options_type: type[OptionsT], values: Mapping[str, Any], task: str) -> OptionsT:
    """`values` (the handler: keys beyond the core ones) as the task's options dataclass.

    An unknown key (a typo such as max_batch_row) or a value of the wrong type stops the start-up with a
    message that lists what is allowed.
    """
    fields = {field.name: field for field in dataclasses.fields(options_type)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        allowed = ", ".join([*CORE_KEYS, *fields])
        raise SettingsError(
            f"model-config.yaml handler: unknown key(s) {', '.join(unknown)} for task {task}; allowed keys: {allowed}"
        )
    hints = typing.get_type_hints(options_type)
    for key, value in values.items():
        expected = hints[key]
        if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
            raise SettingsError(f"handler.{key} must be {expected.__name__}, got {value!r}")
    options = options_type(**values)
    check = getattr(options, "check", None)
    if check is not None:
        check()
    return options
