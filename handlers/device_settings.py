"""The GPU settings of the `handler:` section: CUDA graphs per lane, weights cast once, the attention kernels.
Read and checked here, apart from the lanes' batching settings (handlers/settings.py). All off by default: none
has been measured on a GPU yet (docs/gpu.md, "GPU settings")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from handlers.errors import SettingsError

DEVICE_KEYS = ("cuda_graphs", "graph_sequence_buckets", "cast_weights", "sdpa_backends")
SDPA_BACKENDS = ("flash", "efficient", "math", "cudnn")
CAST_PRECISIONS = ("bf16", "fp16")


@dataclass(frozen=True)
class DeviceSettings:
    # CUDA graphs for a lane's forward pass, true/false for every lane or {lane: true/false, default: ...}: each
    # batch size 1, 2, 4, ... up to the lane's batchSize (and, for text, each sequence bucket) is captured at worker
    # start and replayed, a batch padded up to its bucket; larger batches run eagerly (handlers/cuda_graphs.py).
    # Only on CUDA: a CPU worker runs eagerly whatever this says.
    cuda_graphs: bool | Mapping[str, bool] = False
    # Text lanes with graphs: the padded sequence lengths captured, ascending; null: 16, 32, 64, ... up to
    # max_seq_length. A batch longer than the largest runs eagerly.
    graph_sequence_buckets: tuple[int, ...] | None = None
    # The model file's weights are already at `precision` (exported so: digits.bf16.pt2), so it runs without
    # autocast, its float inputs cast once to that precision; false: autocast re-casts weights on every call.
    cast_weights: bool = False
    # The scaled-dot-product attention kernels a CUDA worker may use, e.g. [flash, efficient, math] to leave cuDNN's
    # out (it plans each new shape); null: torch's choice.
    sdpa_backends: tuple[str, ...] | None = None

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> DeviceSettings:
        buckets = section.get("graph_sequence_buckets")
        backends = section.get("sdpa_backends")
        settings = cls(
            cuda_graphs=section.get("cuda_graphs", cls.cuda_graphs),
            graph_sequence_buckets=_ints("graph_sequence_buckets", buckets) if buckets is not None else None,
            cast_weights=section.get("cast_weights", cls.cast_weights),
            sdpa_backends=_names(backends) if backends is not None else None,
        )
        settings.check()
        return settings

    def check(self) -> None:
        graphs = self.cuda_graphs
        values = graphs.values() if isinstance(graphs, Mapping) else [graphs]
        if not all(isinstance(value, bool) for value in values):
            raise SettingsError(f"handler.cuda_graphs must be true, false or {{lane: true/false, default: ...}}, got {graphs!r}")
        if not isinstance(self.cast_weights, bool):
            raise SettingsError(f"handler.cast_weights must be true or false, got {self.cast_weights!r}")

    def check_with(self, precision: str, model_file: str, max_seq_length: int | None) -> None:
        """The checks that need the core settings: cast weights need a half precision built into the file."""
        if self.cast_weights:
            if precision not in CAST_PRECISIONS:
                raise SettingsError(f"handler.cast_weights needs precision bf16 or fp16, got {precision!r}")
            if f".{precision}." not in model_file:
                raise SettingsError(
                    f"handler.cast_weights: {model_file} is not a {precision} file (export the cast model as "
                    f"<name>.{precision}.pt2: python -m scripts.gpu.models writes one)"
                )
        buckets = self.graph_sequence_buckets
        if buckets and max_seq_length is not None and buckets[-1] > max_seq_length:
            raise SettingsError(
                f"handler.graph_sequence_buckets go up to max_seq_length ({max_seq_length}) at most, got {list(buckets)}"
            )

    def graphs_for(self, lane: str | None) -> bool:
        if isinstance(self.cuda_graphs, Mapping):
            return bool(self.cuda_graphs.get(lane, self.cuda_graphs.get("default", False)))
        return self.cuda_graphs

    def apply_sdpa_backends(self, device: torch.device) -> None:
        """Switch off the attention kernels not named (process-wide flags: a worker serves one model)."""
        if self.sdpa_backends is None or device.type != "cuda":
            return
        switches = {
            "flash": torch.backends.cuda.enable_flash_sdp,
            "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
            "math": torch.backends.cuda.enable_math_sdp,
            "cudnn": torch.backends.cuda.enable_cudnn_sdp,
        }
        for name, switch in switches.items():
            switch(name in self.sdpa_backends)


def _ints(key: str, value: Any) -> tuple[int, ...]:
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        or list(value) != sorted(set(value))
    ):
        raise SettingsError(f"handler.{key} must be a list of positive integers in ascending order, got {value!r}")
    return tuple(value)


def _names(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value or not set(value) <= set(SDPA_BACKENDS):
        raise SettingsError(f"handler.sdpa_backends must be a non-empty list of {', '.join(SDPA_BACKENDS)}, got {value!r}")
    return tuple(value)
