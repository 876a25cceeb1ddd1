"""TorchServe adapter: unpack the request list, call the core, set per-request status, emit metrics.

Packed at the archive root as the handler entry point; everything else lives in the `handlers` package.
"""

from __future__ import annotations

import logging
import os
import time

import orjson
import torch
from ts.metrics.metric_type_enum import MetricTypes

from handlers.core import InferenceCore, Response, select_device
from handlers.decoding import read_request
from handlers.errors import RequestError
from handlers.settings import HandlerSettings

logger = logging.getLogger(__name__)

JSON = "application/json"
# Prometheus names: ts exposes backend metrics by these names (model_metrics_auto_detect=true).
BATCH_REQUESTS = "HandlerBatchRequests"
BATCH_ROWS = "HandlerBatchRows"
HANDLER_LATENCY = "HandlerLatencySeconds"  # seconds: Prometheus default buckets fit
GPU_MEMORY = "HandlerGPUMemoryAllocatedMB"


class UnifiedHandler:
    """One handler for both lanes; the lane (stream or bulk) only changes TorchServe's batching around it."""

    def __init__(self) -> None:
        self.core: InferenceCore | None = None
        # Names the worker in every answer: the hot-swap's drain waits until each worker of the old
        # version has answered a probe (scripts/swap/hot_swap.py).
        self.pid = str(os.getpid())

    def initialize(self, context) -> None:
        properties = context.system_properties
        settings = HandlerSettings.from_yaml(context.model_yaml_config)
        threads = settings.threads_for(context.model_name)
        if threads is not None:
            torch.set_num_threads(threads)
        device = select_device(properties.get("gpu_id"))
        self.core = InferenceCore.load(properties["model_dir"], settings, device)
        logger.info(
            "model %s: task %s on %s, max_batch_rows=%d, precision=%s, deterministic=%s, torch threads=%d",
            context.model_name,
            settings.task,
            device,
            settings.max_batch_rows,
            settings.precision,
            settings.deterministic,
            torch.get_num_threads(),
        )

    def handle(self, data: list[dict], context) -> list[bytes]:
        started = time.perf_counter()
        responses = self.core.answer([_read(request) for request in data])
        for index, response in enumerate(responses):
            context.set_response_content_type(index, JSON)
            context.set_response_header(index, "X-Batch-Requests", str(len(data)))
            context.set_response_header(index, "X-Worker-Pid", self.pid)
            if response.status != 200:
                context.set_response_status(response.status, response.body["message"], index)
        self._emit_metrics(context, responses, time.perf_counter() - started)
        return [orjson.dumps(response.body) for response in responses]

    def _emit_metrics(self, context, responses: list[Response], seconds: float) -> None:
        metrics = context.metrics
        if metrics is None:
            return
        metrics.add_metric(BATCH_REQUESTS, len(responses), "count", metric_type=MetricTypes.HISTOGRAM)
        metrics.add_metric(BATCH_ROWS, sum(r.rows for r in responses), "count", metric_type=MetricTypes.HISTOGRAM)
        metrics.add_metric(HANDLER_LATENCY, seconds, "s", metric_type=MetricTypes.HISTOGRAM)
        if self.core.device.type == "cuda":
            allocated = torch.cuda.memory_allocated(self.core.device) / 2**20
            metrics.add_metric(GPU_MEMORY, allocated, "MB", metric_type=MetricTypes.GAUGE)


def _read(request: dict):
    try:
        return read_request(request)
    except RequestError as error:
        return error
