"""TorchServe adapter: unpack the request list, call the core, set per-request status, emit metrics.

Packed at the archive root as the handler entry point; everything else lives in the `handlers` package.
"""

from __future__ import annotations

import logging
import os
import time

import orjson
import torch

from handlers.collector import PacedCollector
from handlers.core import InferenceCore, Response, StageTimes, select_device
from handlers.cpu_quota import usable_cpus
from handlers.decoding import NO_LIMITS, RequestLimits, read_request
from handlers.device_priority import enter_device_priority, set_mps_priority
from handlers.errors import RequestError
from handlers.headers import BATCH_REQUESTS, WORKER_PID, asks_worker_pid
from handlers.host_memory import MIB, HostMemory
from handlers.lane_signal import LaneSignal, device_name
from handlers.priority import BACKGROUND, OMP_WAIT_POLICY, apply_priority, waits_passively
from handlers.settings import HandlerSettings
from handlers.torchserve.lane_timeout import LaneTimeout
from handlers.torchserve.metrics import HandlerMetrics, configure_logging
from handlers.torchserve.worker_protocol import install as install_frame_reader
from handlers.torchserve.worker_protocol import torchserve_worker
from handlers.yielding import YieldingPasses

logger = logging.getLogger(__name__)

JSON = "application/json"
# TorchServe's worker parses application/json bodies (Python's json) and decodes text/* ones before handle() is
# called, unless this variable says "false" (ts/protocol/otf_message_handler.py reads it for every request).
# Off, the handler gets every body as bytes and checks its size against the lane's max_request_bytes before
# anything becomes Python objects: 64 MiB of {"instances": [{}, ...]} would cost a worker ~2 GiB otherwise.
DECODE_SWITCH = "TS_DECODE_INPUT_REQUEST"


class UnifiedHandler:
    """One handler for both lanes; the lane (stream or bulk) only changes TorchServe's batching around it."""

    def __init__(self) -> None:
        self.core: InferenceCore | None = None
        # Names the worker to a request that asks (handlers/headers.py): the hot-swap's drain waits until each
        # worker of the old version has answered a probe (scripts/swap/hot_swap.py).
        self.pid = str(os.getpid())
        self.metrics: HandlerMetrics | None = None
        self.limits = NO_LIMITS
        self.timeout: LaneTimeout | None = None
        self.memory = HostMemory(None)
        self.collector: PacedCollector | None = None  # only in a TorchServe worker (initialize)
        # An interactive lane raises its device's signal around each batch; a background lane yields to it.
        self.signal: LaneSignal | None = None

    def initialize(self, context) -> None:
        os.environ[DECODE_SWITCH] = "false"
        properties = context.system_properties
        settings = HandlerSettings.from_yaml(context.model_yaml_config, context.model_name)
        # Before any torch op: the intra-op pool and the pass threads are started after this and inherit the policy.
        # Only in a TorchServe worker: a process that builds a handler for other reasons (tests, tools) keeps its own.
        priority = settings.priority_for(context.model_name)
        switched = 0
        if torchserve_worker() is not None:
            switched = apply_priority(priority)
            set_mps_priority(priority)  # before the first CUDA call makes the context
        # Before the model loads, so its blocks follow the fixed thresholds too (handlers/host_memory.py).
        lane = context.model_name
        self.memory = HostMemory.for_this_process(settings.mmap_threshold_bytes(lane), settings.heap_slack_bytes(lane))
        # A lane without a thread count (the bulk lanes) gets one per CPU the container may use, not per host core.
        threads = settings.threads_for(context.model_name) or usable_cpus()
        torch.set_num_threads(threads)
        logger.setLevel(configure_logging(context.model_yaml_config))  # this module is packed outside `handlers`
        logger.info("model %s: priority %s (%d threads at SCHED_IDLE)", context.model_name, priority, switched)
        if priority == BACKGROUND and not waits_passively():
            logger.warning(
                "model %s: background lane but %s is %r: its OpenMP threads spin between passes; start TorchServe "
                "with %s=PASSIVE (scripts/server/process.py does)",
                context.model_name,
                OMP_WAIT_POLICY,
                os.environ.get(OMP_WAIT_POLICY),
                OMP_WAIT_POLICY,
            )
        device = select_device(properties.get("gpu_id"))
        enter_device_priority(device, priority)
        self.core = InferenceCore.load(properties["model_dir"], settings, device)
        lane = context.model_name
        if settings.device.graphs_for(lane):  # on this thread, the one TorchServe runs handle() on
            self.core.capture_graphs(int(properties.get("batch_size") or 1))
        passes = self.core.run_passes_at_once(settings.passes_for(lane) or usable_cpus())
        self._share_device(priority, settings, device, passes)
        self.limits = RequestLimits(
            lane,
            settings.rows_for(lane),
            settings.named_lanes_rows(),
            self.core.task.raw_media,
            settings.bytes_for(lane),
            settings.named_lanes_bytes(),
        )
        timeout_s = settings.timeout_for(lane)
        if timeout_s is not None:
            self.timeout = LaneTimeout.for_lane(lane, timeout_s, priority == BACKGROUND and device.type == "cpu")
        # From the next message on (this load's answer has not been sent yet, so nothing is buffered half read).
        fast_protocol = settings.fast_protocol and install_frame_reader(self.limits.max_bytes)
        logger.info(
            "model %s: task %s on %s, max_batch_rows=%d, max_request_rows=%s, max_request_bytes=%s, "
            "response_timeout_s=%s, precision=%s, deterministic=%s, torch threads=%d, passes at once=%d, fast protocol=%s, "
            "mmap threshold=%s",
            context.model_name,
            settings.task,
            device,
            settings.max_batch_rows,
            self.limits.max_rows,
            self.limits.max_bytes,
            timeout_s if self.timeout is None else f"{timeout_s} ({self.timeout.clock.counts} time)",
            settings.precision,
            settings.deterministic,
            torch.get_num_threads(),
            passes,
            fast_protocol,
            f"{self.memory.threshold // MIB} MiB" if self.memory.threshold else "unchanged",
        )
        self.metrics = HandlerMetrics.for_context(context, device)
        self.metrics.started()
        logger.info("model %s: worker at rest %.0f MiB", context.model_name, self.memory.settle() / 2**20)
        # The loaded model and its imports frozen, collections between batches (handlers/collector.py); only in a
        # TorchServe worker, never in a process that builds a handler for other reasons (tests, tools).
        if torchserve_worker() is not None:
            self.collector = PacedCollector()
            self.collector.start()

    def _share_device(self, priority: str, settings: HandlerSettings, device: torch.device, passes: int) -> None:
        """The stream lanes' busy signal of this device (handlers/lane_signal.py): raised by this lane, or yielded to."""
        pass_s = settings.yield_pass_s()
        if pass_s == 0:
            return
        self.signal = LaneSignal(device_name(device))
        if priority != BACKGROUND:
            if self.signal.claim() is None:
                logger.warning("every slot of %s is taken: this worker's batches are not signalled", self.signal.path)
            return
        full = settings.max_batch_rows * passes
        self.core.yielding = YieldingPasses.for_lane(self.signal, settings, full, device.type == "cpu")

    def handle(self, data: list[dict], context) -> list[bytes]:
        if self.timeout is not None:
            self.timeout.running(len(data))
        try:
            if self.signal is not None and self.core.yielding is None:
                with self.signal.raised():
                    return self.answer_batch(data, context)
            return self.answer_batch(data, context)
        finally:
            if self.core.yielding is not None:
                taken = self.core.yielding.stats.take()
                self.metrics.yielded(taken.yielded_s, taken.holds_s + taken.holds_after_full_s)
            if self.timeout is not None:
                self.timeout.done()
            if self.collector is not None:
                self.collector.tick()
            # The batch's bodies and activations are freed by now; TorchServe still holds the answers' bytes.
            self.memory.after_batch()

    def answer_batch(self, data: list[dict], context) -> list[bytes]:
        """One TorchServe batch: a response body per request, in order."""
        started = time.perf_counter()
        stages = StageTimes()
        payloads = [self._read(request, context, index) for index, request in enumerate(data)]
        stages.decode = time.perf_counter() - started
        responses = self.core.answer(payloads, stages)
        for index, response in enumerate(responses):
            context.set_response_content_type(index, JSON)
            context.set_response_header(index, BATCH_REQUESTS, str(len(data)))
            if asks_worker_pid(_headers(context, index)):
                context.set_response_header(index, WORKER_PID, self.pid)
            if response.status != 200:
                context.set_response_status(response.status, _reason_phrase(response.body["message"]), index)
                # One line per failed request, whatever the log settings (the access log keeps failed ones too).
                logger.warning(
                    "lane %s request %s answered %d: %s",
                    context.model_name,
                    context.get_request_id(index),
                    response.status,
                    _reason_phrase(response.body["message"])[:300],
                )
        encoding = time.perf_counter()
        bodies = [orjson.dumps(response.body) for response in responses]
        self._emit_metrics(responses, stages, started, encoding)
        return bodies

    def _read(self, request: dict, context, index: int):
        """The request's Payload, or the RequestError that is its answer."""
        try:
            return read_request(request, _headers(context, index), self.limits)
        except RequestError as error:
            return error

    def _emit_metrics(self, responses: list[Response], stages: StageTimes, started: float, encoding: float) -> None:
        """Metrics and the debug line of one batch (handlers/torchserve/metrics.py); `encoding`: when JSON serialization began."""
        finished = time.perf_counter()
        stages.encode += finished - encoding
        self.metrics.batch(responses, stages, finished - started)


def _headers(context, index: int) -> dict:
    """Request `index`'s headers as the worker got them: each parameter's {"content-type": ...}, the HTTP headers."""
    return context.get_all_request_header(index) or {}


def _reason_phrase(message: str) -> str:
    """The message as an HTTP reason phrase: one line of ASCII (it may quote what a client sent; the JSON
    body keeps the message as it is)."""
    return " ".join(message.splitlines()).encode("ascii", "backslashreplace").decode("ascii")
