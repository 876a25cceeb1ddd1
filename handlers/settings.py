"""Handler settings: the `handler:` section of the archive's model-config.yaml, read and checked in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from handlers.errors import SettingsError

PRECISIONS = ("fp32", "bf16", "fp16", "int8")
# The keys every task shares; each task declares its own further keys as a typed dataclass (handlers/tasks/).
CORE_KEYS = ("task", "model_file", "max_batch_rows", "precision", "deterministic", "torch_threads")


@dataclass(frozen=True)
class HandlerSettings:
    task: str
    model_file: str
    max_batch_rows: int = 256
    precision: str = "fp32"
    # Run every micro-batch at exactly max_batch_rows rows (zero-padded), so a row's result does not
    # depend on what else shared its batch: bitwise-equal answers across stream, bulk and in-process.
    deterministic: bool = False
    # Intra-op threads per worker process: one number for every lane, or {lane name: number or null} with
    # an optional `default` entry for lanes not named; null (or no entry) keeps torch's default, a thread
    # per core. TorchServe never limits its Python workers'
    # threads: on a CPU, each worker's OpenMP threads then spin on the cores the frontend and the other
    # workers need. Stream lanes scale by workers of one thread each.
    torch_threads: int | Mapping[str, int] | None = None
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
            torch_threads=section.get("torch_threads", cls.torch_threads),
            task_options={k: v for k, v in section.items() if k not in CORE_KEYS},
        )
        settings.check()
        return settings

    def check(self) -> None:
        if not isinstance(self.max_batch_rows, int) or isinstance(self.max_batch_rows, bool) or self.max_batch_rows < 1:
            raise SettingsError(f"handler.max_batch_rows must be a positive integer, got {self.max_batch_rows!r}")
        if self.precision not in PRECISIONS:
            raise SettingsError(f"handler.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        threads = self.torch_threads
        counts = threads.values() if isinstance(threads, Mapping) else [threads]
        if any(count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1) for count in counts):
            raise SettingsError(
                f"handler.torch_threads must be a positive integer or {{lane: positive integer or null}}, got {threads!r}"
            )
        if not isinstance(self.deterministic, bool):
            raise SettingsError(f"handler.deterministic must be true or false, got {self.deterministic!r}")

    def threads_for(self, lane: str) -> int | None:
        """torch threads for a worker of `lane` (TorchServe's model name), None for torch's default."""
        if isinstance(self.torch_threads, Mapping):
            return self.torch_threads.get(lane, self.torch_threads.get("default"))
        return self.torch_threads
