"""The handler's metrics, emitted through TorchServe's metrics API, and one debug log line per TorchServe batch.

Every metric here is declared, with the same name, type, unit and dimensions, in the server's metrics.yaml
(config.properties' metrics_config=): the frontend registers declared metrics at start-up, so /metrics lists
them before the first request, and with model_metrics_auto_detect=false nothing undeclared is exported.
tests/unit/handlers/test_metrics.py keeps the two lists equal. Each is labelled by `model` (the archive's model
name) and `lane` (context.model_name: digits, digits-bulk, ...). Prometheus sees the names unchanged:
histograms as <name>_bucket/_sum/_count, counters as <name>_total.

Cost: a line per series and batch (the frontend parses it), never per row. The lines are TorchServe's own format
(`ts.metrics.caching_metric.CachingMetric.emit_metrics`, which tests/unit/handlers/test_metrics.py compares them
with), written here from the handles' names, units and types looked up once at start-up: a batch's lines go out as
one record of TorchServe's metric logger, hence one write to the worker's stdout. CachingMetric.add_or_update made a
log record per line (findCaller, a hostname and clock read each: ~30 µs a line, most of the handler's metric cost)
and each write woke the frontend's reader thread (py-spy: docs/benchmarks.md). TorchServe's own per-batch line
(PredictionTime, not in metrics.yaml, so never exported) is dropped in the worker for the same reason.
"""

from __future__ import annotations

import logging
import socket
import time
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
# Background lanes, per batch (handlers/yielding.py): time yielded to busy stream lanes; each hold after a rise.
YIELDED = MetricSpec("HandlerYieldSeconds", "s", HISTOGRAM)
YIELD_HOLD = MetricSpec("HandlerYieldHoldSeconds", "s", HISTOGRAM)
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
    YIELDED,
    YIELD_HOLD,
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


_METRIC_LINES = logging.getLogger(METRIC_LOGGER)


def _emit_lines(lines: list[str]) -> None:
    """A batch's metric lines as one record of TorchServe's metric logger (one write to the worker's stdout, which
    the frontend reads line by line); the gate lets handler lines through and nothing else."""
    if not lines:
        return
    _GATE.open = True
    try:
        _METRIC_LINES.info("\n".join(lines))
    finally:
        _GATE.open = False


class HandlerMetrics:
    """The metric handles of one lane's worker, looked up once; `batch()` emits one batch's figures."""

    def __init__(self, cache: Any, model: str, lane: str, device: torch.device) -> None:
        self.lane = lane
        self.device = device
        self.handles = {spec.name: _handle(cache, spec) for spec in METRICS} if cache is not None else {}
        # Each line up to its value, and what follows the value up to the clock (as CachingMetric.emit_metrics).
        self._heads = {name: f"[METRICS]{handle.metric_name}.{handle.unit}:" for name, handle in self.handles.items()}
        self._types = {name: f"|#type:{handle.metric_type.name}" for name, handle in self.handles.items()}
        self._dimensions = f"|#model:{model},lane:{lane}"
        self._host = f"|#hostname:{socket.gethostname()},"

    @classmethod
    def for_context(cls, context, device: torch.device) -> HandlerMetrics:
        manifest = getattr(context, "manifest", None) or {}
        model = manifest.get("model", {}).get("modelName") or context.model_name
        return cls(context.metrics, model, context.model_name, device)

    def started(self) -> None:
        """A worker of this lane finished initialize()."""
        lines: list[str] = []
        self._emit(lines, WORKER_STARTS, 1)
        if self.device.type == "cuda":
            self._emit(lines, GPU_TOTAL, torch.cuda.get_device_properties(self.device).total_memory / 2**20)
        self._write(lines)

    def batch(self, responses: Sequence[Response], stages: StageTimes, seconds: float) -> None:
        """One TorchServe batch: its sizes, stage times, forward passes, errors, and (CUDA) device memory."""
        rows = sum(response.rows for response in responses)
        if self.handles:
            lines: list[str] = []
            self._emit_batch(lines, responses, rows, stages, seconds)
            self._write(lines)
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

    def yielded(self, seconds: float, holds_s: Sequence[float]) -> None:
        """A background lane's batch: the seconds it yielded and each hold its pass threads saw (handlers/yielding.py
        YieldStats: what a thread ran from a stream signal's rise to its yield)."""
        if self.handles:
            lines: list[str] = []
            self._emit(lines, YIELDED, seconds)
            for hold in holds_s:
                self._emit(lines, YIELD_HOLD, hold)
            self._write(lines)

    def _emit_batch(self, lines: list[str], responses: Sequence[Response], rows: int, stages: StageTimes, seconds: float) -> None:
        emit = self._emit
        emit(lines, BATCH_REQUESTS, len(responses))
        emit(lines, BATCH_ROWS, rows)
        emit(lines, LATENCY, seconds)
        emit(lines, DECODE, stages.decode)
        emit(lines, COLLATE, stages.collate)
        emit(lines, FORWARD, stages.forward)
        emit(lines, ENCODE, stages.encode)
        for count in stages.forward_rows:
            emit(lines, FORWARD_ROWS, count)
        if stages.oom_splits:
            emit(lines, OOM_SPLITS, stages.oom_splits)
        errors = [response.status for response in responses if response.status != 200]
        for code, count in Counter(errors).items():
            emit(lines, ERRORS, count, f",code:{code}")
        if self.device.type == "cuda":
            emit(lines, GPU_ALLOCATED, torch.cuda.memory_allocated(self.device) / 2**20)
            emit(lines, GPU_RESERVED, torch.cuda.memory_reserved(self.device) / 2**20)

    def _emit(self, lines: list[str], spec: MetricSpec, value: float, more_dimensions: str = "") -> None:
        """`[METRICS]Name.Unit:value|#model:m,lane:l[,code:c]|#type:TYPE|#hostname:h,<unix seconds>`, the line
        CachingMetric.add_or_update would log (timestamped in _write, once per batch)."""
        if spec.name in self._heads:
            lines.append(f"{self._heads[spec.name]}{value}{self._dimensions}{more_dimensions}{self._types[spec.name]}")

    def _write(self, lines: list[str]) -> None:
        stamp = f"{self._host}{int(time.time())}"
        _emit_lines([line + stamp for line in lines])


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
    # only the handler's (_emit_lines).
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
