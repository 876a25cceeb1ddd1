"""The handler's metrics, emitted through TorchServe's metrics API, and one debug log line per TorchServe batch.

Every metric here is declared, with the same name, type, unit and dimensions, in the server's metrics.yaml
(config.properties' metrics_config=): the frontend registers declared metrics at start-up, so /metrics lists
them before the first request, and with model_metrics_auto_detect=false nothing undeclared is exported.
tests/unit/handlers/test_metrics.py keeps the two lists equal. Each is labelled by `model` (the archive's model
name) and `lane` (context.model_name: digits, digits-bulk, ...). Prometheus sees the names unchanged:
histograms as <name>_bucket/_sum/_count, counters as <name>_total.

Cost: one CachingMetric.add_or_update per series and batch (a formatted stdout line the frontend parses), never
per row; the handles are looked up once at start-up.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from ts.metrics.metric_cache_errors import MetricsCacheKeyError
from ts.metrics.metric_type_enum import MetricTypes

from handlers.core import Response, StageTimes
from handlers.errors import SettingsError

logger = logging.getLogger(__name__)

LABELS = ("model", "lane")


@dataclass(frozen=True)
class MetricSpec:
    """One metric as the handler emits it and metrics.yaml declares it."""

    name: str
    unit: str  # a ts unit key (s, count, MB): the backend writes its long form (Seconds, Count, Megabytes)
    type: MetricTypes
    dimensions: tuple[str, ...] = LABELS


HISTOGRAM, COUNTER, GAUGE = MetricTypes.HISTOGRAM, MetricTypes.COUNTER, MetricTypes.GAUGE
# Per TorchServe batch (one handle() call).
BATCH_REQUESTS = MetricSpec("HandlerBatchRequests", "count", HISTOGRAM)  # requests TorchServe batched
BATCH_ROWS = MetricSpec("HandlerBatchRows", "count", HISTOGRAM)  # rows of the requests answered
LATENCY = MetricSpec("HandlerLatencySeconds", "s", HISTOGRAM)  # the whole handle() call
DECODE = MetricSpec("HandlerDecodeSeconds", "s", HISTOGRAM)  # bodies -> rows (JSON parsing, image decoding, tokenizing)
COLLATE = MetricSpec("HandlerCollateSeconds", "s", HISTOGRAM)  # rows -> device batches (preprocess)
FORWARD = MetricSpec("HandlerForwardSeconds", "s", HISTOGRAM)  # forward passes, outputs back on the CPU (inference)
ENCODE = MetricSpec("HandlerEncodeSeconds", "s", HISTOGRAM)  # outputs -> results -> JSON bodies (postprocess)
# Per forward pass, per error, per event.
FORWARD_ROWS = MetricSpec("HandlerForwardRows", "count", HISTOGRAM)  # rows in one forward pass
ERRORS = MetricSpec("HandlerErrors", "count", COUNTER, (*LABELS, "code"))  # requests answered with a 4xx/5xx, by code
OOM_SPLITS = MetricSpec("HandlerOOMSplits", "count", COUNTER)  # micro-batches halved after an out-of-memory
WORKER_STARTS = MetricSpec("HandlerWorkerStarts", "count", COUNTER)  # initialize() calls: > 1 a lane means restarts
# CUDA only, after each batch.
GPU_ALLOCATED = MetricSpec("HandlerGPUMemoryAllocatedMB", "MB", GAUGE)  # torch.cuda.memory_allocated
GPU_RESERVED = MetricSpec("HandlerGPUMemoryReservedMB", "MB", GAUGE)  # torch.cuda.memory_reserved (the caching pool)
GPU_TOTAL = MetricSpec("HandlerGPUMemoryTotalMB", "MB", GAUGE)  # the device's memory, once at start-up (alerts' limit)

METRICS = (
    BATCH_REQUESTS,
    BATCH_ROWS,
    LATENCY,
    DECODE,
    COLLATE,
    FORWARD,
    ENCODE,
    FORWARD_ROWS,
    ERRORS,
    OOM_SPLITS,
    WORKER_STARTS,
    GPU_ALLOCATED,
    GPU_RESERVED,
    GPU_TOTAL,
)


class HandlerMetrics:
    """The metric handles of one lane's worker, looked up once; `batch()` emits one batch's figures."""

    def __init__(self, cache: Any, model: str, lane: str, device: torch.device) -> None:
        self.labels = [model, lane]
        self.lane = lane
        self.device = device
        self.handles = {spec.name: _handle(cache, spec) for spec in METRICS} if cache is not None else {}

    @classmethod
    def for_context(cls, context, device: torch.device) -> HandlerMetrics:
        manifest = getattr(context, "manifest", None) or {}
        model = manifest.get("model", {}).get("modelName") or context.model_name
        return cls(context.metrics, model, context.model_name, device)

    def started(self) -> None:
        """A worker of this lane finished initialize()."""
        self._emit(WORKER_STARTS, 1)
        if self.device.type == "cuda":
            self._emit(GPU_TOTAL, torch.cuda.get_device_properties(self.device).total_memory / 2**20)

    def batch(self, responses: Sequence[Response], stages: StageTimes, seconds: float) -> None:
        """One TorchServe batch: its sizes, stage times, forward passes, errors, and (CUDA) device memory."""
        rows = sum(response.rows for response in responses)
        if self.handles:
            emit = self._emit
            emit(BATCH_REQUESTS, len(responses))
            emit(BATCH_ROWS, rows)
            emit(LATENCY, seconds)
            emit(DECODE, stages.decode)
            emit(COLLATE, stages.collate)
            emit(FORWARD, stages.forward)
            emit(ENCODE, stages.encode)
            for count in stages.forward_rows:
                emit(FORWARD_ROWS, count)
            if stages.oom_splits:
                emit(OOM_SPLITS, stages.oom_splits)
            errors = [response.status for response in responses if response.status != 200]
            for code, count in Counter(errors).items():
                self.handles[ERRORS.name].add_or_update(count, [*self.labels, str(code)])
            if self.device.type == "cuda":
                emit(GPU_ALLOCATED, torch.cuda.memory_allocated(self.device) / 2**20)
                emit(GPU_RESERVED, torch.cuda.memory_reserved(self.device) / 2**20)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "batch lane=%s requests=%d rows=%d errors=%d forwards=%s oom_splits=%d "
                "decode_ms=%.3f collate_ms=%.3f forward_ms=%.3f encode_ms=%.3f total_ms=%.3f",
                self.lane,
                len(responses),
                rows,
                sum(response.status != 200 for response in responses),
                stages.forward_rows,
                stages.oom_splits,
                stages.decode * 1000,
                stages.collate * 1000,
                stages.forward * 1000,
                stages.encode * 1000,
                seconds * 1000,
            )

    def _emit(self, spec: MetricSpec, value: float) -> None:
        handle = self.handles.get(spec.name)
        if handle is not None:
            handle.add_or_update(value, self.labels)


def configure_logging(model_yaml_config: Any) -> None:
    """`logging: {level: debug}` in the archive's model-config.yaml turns on the per-batch debug line.

    TorchServe's worker logs at INFO to its stdout, which the frontend writes to logs/model_log.log."""
    section = (model_yaml_config or {}).get("logging")
    if not section:
        return  # the worker's own level: INFO
    level = str(section.get("level", "info")).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingsError(f"model-config.yaml logging.level must be debug, info, warning or error, got {level.lower()!r}")
    logging.getLogger("handlers").setLevel(level)


def _handle(cache: Any, spec: MetricSpec):
    """The declared metric from TorchServe's cache (metrics.yaml), or one added like it where the server runs
    with a metrics config that lacks it (then the frontend exports it only with model_metrics_auto_detect)."""
    try:
        return cache.get_metric(spec.name, spec.type)
    except MetricsCacheKeyError:
        return cache.add_metric_to_cache(spec.name, spec.unit, list(spec.dimensions), spec.type)
