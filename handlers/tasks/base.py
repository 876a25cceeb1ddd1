"""The hooks a model kind implements, and how its typed options are read; the core never looks inside a row."""

from __future__ import annotations

import abc
import dataclasses
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

from handlers.errors import SettingsError
from handlers.settings import CORE_KEYS


class Task(abc.ABC):
    """What a model kind implements: decode -> collate -> forward -> unbatch, LitServe-style. Rows are opaque to the
    core. A subclass names itself (`name`, what model-config.yaml's handler.task says) and is found by it: a new
    task is one module in handlers/tasks/, nothing else to edit (handlers/tasks/__init__.py imports them all)."""

    name: ClassVar[str]
    # The task's own handler: keys, as a frozen dataclass whose fields have defaults.
    Options: ClassVar[type]
    # Media type prefixes a raw body may be sent as ("image/", "text/", ...); another gets a 415 before decoding.
    raw_media: ClassVar[tuple[str, ...]] = ()
    # The request bodies the task accepts, as OpenAPI 3.0 schemas by media type (docs/architecture.md §5): what
    # `make fuzz` describes to schemathesis, and what every model's samples are checked against (a unit test).
    request_bodies: ClassVar[Mapping[str, Mapping[str, Any]]]
    # A JSON instance decoded once to capture CUDA graphs (InferenceCore.capture_graphs); None: the task cannot.
    GRAPH_EXAMPLE_ITEM: ClassVar[Any] = None
    # Rows of a variable length (text): the longest, so CUDA graphs are captured per length bucket up to it.
    max_seq_length: int | None = None

    registered: ClassVar[dict[str, type[Task]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            known = cls.registered.get(cls.name, cls)
            if (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):  # a module reloaded: same
                raise TypeError(
                    f"two tasks are named {cls.name!r}: {cls.registered[cls.name].__qualname__} and {cls.__qualname__}"
                )
            if not isinstance(getattr(cls, "request_bodies", None), Mapping):
                raise TypeError(f"task {cls.name!r} declares no request_bodies (its request contract, by media type)")
            cls.registered[cls.name] = cls

    def __init__(self, options: Any) -> None:
        self.options = options

    @abc.abstractmethod
    def load_model(self, model_path: Path, device: torch.device) -> Any:
        """Load the exported model file (no pickle) onto `device`, ready for forward()."""

    @abc.abstractmethod
    def decode_raw(self, body: bytes | str) -> Any:
        """One raw request body -> one row; raise RequestError naming what is wrong."""

    @abc.abstractmethod
    def decode_instance(self, item: Any) -> Any:
        """One JSON instance -> one row; raise RequestError naming what is wrong."""

    @abc.abstractmethod
    def collate(self, rows: Sequence[Any], pad_to: int | None) -> Any:
        """Rows -> a CPU batch (a tensor or dict of tensors). `pad_to` fixes the batch's shape (deterministic mode)."""

    @abc.abstractmethod
    def forward(self, model: Any, batch: Any) -> torch.Tensor:
        """Run the model on a device batch; return one output row per input row (padding included)."""

    @abc.abstractmethod
    def unbatch(self, outputs: torch.Tensor, rows: Sequence[Any]) -> list[Any]:
        """Float32 CPU outputs for `rows` -> one JSON-ready result per row."""

    # -- optional hooks, with what the core does when a task leaves them alone --------------------------------------

    def load_files(self, folder: Path) -> None:
        """Read the files the task needs beside the model file (a tokenizer, class names) from `folder`; load_model
        calls it, and so does a core built around an eager module (scripts/gpu/). Default: none."""
        return None

    def row_cost(self, row: Any) -> int:
        """Relative size of a row; rows are grouped by it (e.g. token count) before micro-batching. Default: equal."""
        return 1

    def for_request(self) -> Task:
        """The decoders for one request, for limits that span its items (a pixel budget); InferenceCore.decode calls it
        once per request. Default: this task."""
        return self

    def decode_many(self, items: Sequence[Any]) -> list[Any] | None:
        """Every JSON instance of a request at once (vectorised), giving exactly the rows decode_instance gives item by
        item, or None to let the core decode item by item (so errors name the first bad item). Default: None."""
        return None


def instances_body(item: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON request body {"instances": [item, ...]} with at least one item, as a schema."""
    return {
        "type": "object",
        "required": ["instances"],
        "properties": {"instances": {"type": "array", "minItems": 1, "items": dict(item)}},
    }


B64_IMAGE = {
    "type": "object",
    "required": ["b64"],
    "properties": {"b64": {"type": "string", "format": "byte"}},
    "additionalProperties": False,
}
BINARY = {"type": "string", "format": "binary"}


def require_positive(options: Any, *keys: str) -> None:
    """An options dataclass's check(): each of `keys` a positive integer, else a SettingsError naming it."""
    for key in keys:
        if getattr(options, key) < 1:
            raise SettingsError(f"handler.{key} must be a positive integer, got {getattr(options, key)!r}")


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
