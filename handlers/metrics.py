"""The handler's metrics, emitted through TorchServe's metrics API, and one debug log line per TorchServe batch.

Every metric here is declared, with the same name, type, unit and dimensions, in the server's metrics.yaml
(config.properties' metrics_config=): the frontend registers declared metrics at start-up, so /metrics lists
them before the first request, and with model_metrics_auto_detect=false nothing undeclared is exported.
tests/unit/handlers/test_metrics.py keeps the two lists equal. Each is labelled by `model` (the archive's model
name) and `lane` (context.model_name: digits, digits-bulk, ...). Prometheus sees the names unchanged:
histograms as <name>_bucket/_sum/_count, counters as <name>_total.

Cost: one CachingMetric.add_or_update per series and batch (a formatted line the frontend parses), never per row;
the handles are looked up once at start-up. A batch's lines leave the worker in one write to stdout: each write
wakes the frontend's reader thread, which on a lone request cost more than the lines themselves (py-spy:
docs/benchmarks.md). TorchServe's own per-batch line (PredictionTime, not in metrics.yaml, so never exported)
is dropped in the worker for the same reason.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
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


class _MetricGate(logging.Filter):
    """On TorchServe's metric logger: lets lines through only while the handler emits (PredictionTime is not)."""

    def __init__(self) -> None:
        super().__init__()
        self.open = False

    def filter(self, record: logging.LogRecord) -> bool:
        return self.open


METRIC_LOGGER = "ts.metrics.caching_metric"  # CachingMetric.emit_metrics logs each line through it
_GATE = _MetricGate()


@contextlib.contextmanager
def one_write():
    """The metric lines emitted inside leave in one write: the worker's stdout log handlers (TorchServe's worker
    logs to its stdout, which the frontend reads line by line) write into a buffer meanwhile."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler) and h.stream is sys.stdout]
    buffer = io.StringIO()
    for handler in handlers:
        handler.stream = buffer
    _GATE.open = True
    try:
        yield
    finally:
        _GATE.open = False
        for handler in handlers:
            handler.stream = sys.stdout
        if text := buffer.getvalue():
            sys.stdout.write(text)
            sys.stdout.flush()


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
        with one_write():
            self._emit(WORKER_STARTS, 1)
            if self.device.type == "cuda":
                self._emit(GPU_TOTAL, torch.cuda.get_device_properties(self.device).total_memory / 2**20)

    def batch(self, responses: Sequence[Response], stages: StageTimes, seconds: float) -> None:
        """One TorchServe batch: its sizes, stage times, forward passes, errors, and (CUDA) device memory."""
        rows = sum(response.rows for response in responses)
        if self.handles:
            with one_write():
                self._emit_batch(responses, rows, stages, seconds)
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

    def _emit_batch(self, responses: Sequence[Response], rows: int, stages: StageTimes, seconds: float) -> None:
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

    def _emit(self, spec: MetricSpec, value: float) -> None:
        handle = self.handles.get(spec.name)
        if handle is not None:
            handle.add_or_update(value, self.labels)


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def configure_logging(model_yaml_config: Any) -> str:
    """The worker's log levels from the archive's model-config.yaml `logging:` section; returns the handler's level.

    `level` (default info) is the handler's: debug adds one line per batch. `torchserve` (default warning) is
    TorchServe's own Python side in the worker, which at info writes a line per batch ("Backend received
    inference at: ...") for the frontend to copy into logs/model_log.log. Either way the worker's stdout goes
    to that file through the frontend (monitoring/log4j2.xml)."""
    section = (model_yaml_config or {}).get("logging") or {}
    level = _level(section, "level", "info")
    logging.getLogger().setLevel(_level(section, "torchserve", "warning"))
    # Metric lines are info lines of TorchServe's metric logger, whatever the worker's level; the gate lets through
    # only the handler's (one_write).
    metric_logger = logging.getLogger(METRIC_LOGGER)
    metric_logger.setLevel(logging.INFO)
    if _GATE not in metric_logger.filters:
        metric_logger.addFilter(_GATE)
    logging.getLogger("handlers").setLevel(level)
    return level


def _level(section: Any, key: str, default: str) -> str:
    level = str(section.get(key, default)).upper()
    if level not in LEVELS:
        raise SettingsError(f"model-config.yaml logging.{key} must be debug, info, warning or error, got {level.lower()!r}")
    return level


def _handle(cache: Any, spec: MetricSpec):
    """The declared metric from TorchServe's cache (metrics.yaml), or one added like it where the server runs
    with a metrics config that lacks it (then the frontend exports it only with model_metrics_auto_detect)."""
    try:
        return cache.get_metric(spec.name, spec.type)
    except MetricsCacheKeyError:
        return cache.add_metric_to_cache(spec.name, spec.unit, list(spec.dimensions), spec.type)
