"""Handler settings: the `handler:` section of the archive's model-config.yaml, read and checked in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from handlers.errors import SettingsError

PRECISIONS = ("fp32", "bf16", "fp16")
# The keys every task shares; each task declares its own further keys as a typed dataclass (handlers/tasks/).
CORE_KEYS = ("task", "model_file", "max_batch_rows", "precision", "deterministic")


@dataclass(frozen=True)
class HandlerSettings:
    task: str
    model_file: str
    max_batch_rows: int = 256
    precision: str = "fp32"
    # Run every micro-batch at exactly max_batch_rows rows (zero-padded), so a row's result does not
    # depend on what else shared its batch: bitwise-equal answers across stream, bulk and in-process.
    deterministic: bool = False
    task_options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_yaml(cls, model_yaml_config: Mapping[str, Any] | None) -> HandlerSettings:
        """Build from TorchServe's parsed model-config.yaml (context.model_yaml_config)."""
        section = (model_yaml_config or {}).get("handler")
        if not isinstance(section, Mapping):
            raise SettingsError("model-config.yaml has no 'handler:' section; it must name at least task and model_file")
        for key in ("task", "model_file"):
            if not section.get(key):
                raise SettingsError(f"model-config.yaml handler.{key} is required")
        settings = cls(
            task=str(section["task"]),
            model_file=str(section["model_file"]),
            max_batch_rows=section.get("max_batch_rows", cls.max_batch_rows),
            precision=str(section.get("precision", cls.precision)),
            deterministic=section.get("deterministic", cls.deterministic),
            task_options={k: v for k, v in section.items() if k not in CORE_KEYS},
        )
        settings.check()
        return settings

    def check(self) -> None:
        if not isinstance(self.max_batch_rows, int) or isinstance(self.max_batch_rows, bool) or self.max_batch_rows < 1:
            raise SettingsError(f"handler.max_batch_rows must be a positive integer, got {self.max_batch_rows!r}")
        if self.precision not in PRECISIONS:
            raise SettingsError(f"handler.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not isinstance(self.deterministic, bool):
            raise SettingsError(f"handler.deterministic must be true or false, got {self.deterministic!r}")
