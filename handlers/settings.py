"""Handler settings: the `handler:` section of the archive's model-config.yaml, read and checked in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from handlers.device_settings import DEVICE_KEYS, DeviceSettings
from handlers.errors import SettingsError
from handlers.priority import PerLanePriority, check_priority, priority_for

PRECISIONS = ("fp32", "bf16", "fp16", "int8")
# The keys every task shares; each task declares its own further keys as a typed dataclass (handlers/tasks/).
CORE_KEYS = (
    "task",
    "model_file",
    "max_batch_rows",
    "max_batch_tokens",
    "precision",
    "deterministic",
    "torch_threads",
    "max_request_rows",
    "max_request_bytes",
    "response_timeout_s",
    "fast_protocol",
    "mmap_threshold_mib",
    "heap_slack_mib",
    "forward_passes",
    "priority",
    "yield_pass_ms",
    "yield_linger_ms",
    "yield_between_operators",
)
# A value set for every lane at once, or per lane: {lane name: value or null, default: value for lanes not named}.
PerLane = int | Mapping[str, int | None] | None
DEFAULT_LANE = "default"
# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2: 32 MiB on 64-bit.
MAX_MMAP_THRESHOLD_MIB = 32


@dataclass(frozen=True)
class HandlerSettings:
    task: str
    model_file: str
    # Rows per forward pass on this lane: in model-config.yaml one number for every lane, or per lane like
    # torch_threads ({lane: number, default: number}); from_yaml resolves it for the lane it reads for. Rows of
    # one pass are its activations: a stream lane keeps passes small (a worker's peak memory), a bulk lane
    # large (its throughput).
    max_batch_rows: int = 256
    # Padded tokens per forward pass (rows x the task's cost of the pass's longest row: tokens for text, 1 for an
    # image), resolved for the lane like max_batch_rows; null: max_batch_rows alone. A pass's activations grow
    # with its padded tokens (and attention with their length), so a stream lane can take a full batch of short
    # texts in one pass and long ones in several small passes. Deterministic mode pads every pass to
    # max_batch_rows full rows whatever this says.
    max_batch_tokens: int | None = None
    precision: str = "fp32"
    # Run every micro-batch at exactly max_batch_rows rows (zero-padded), so a row's result does not
    # depend on what else shared its batch: bitwise-equal answers across stream, bulk and in-process.
    deterministic: bool = False
    # Intra-op threads per worker process: one number for every lane, or {lane name: number or null} with
    # an optional `default` entry for lanes not named; null (or no entry) keeps torch's default, a thread
    # per core. TorchServe never limits its Python workers'
    # threads: on a CPU, each worker's OpenMP threads then spin on the cores the frontend and the other
    # workers need. Stream lanes scale by workers of one thread each.
    torch_threads: PerLane = None
    # The most rows (instances) one request may carry, per lane like torch_threads; null: no row limit. A stream
    # lane takes what an interactive client sends; a larger request gets a 413 naming the lanes that take it.
    # Sized so the answer stays under config.properties' max_response_size (docs/hardening.md, "Limits").
    max_request_rows: PerLane = None
    # The most bytes one request's body may have, per lane; checked on the raw bytes before they are parsed
    # (the worker gets bodies undecoded, handlers/torchserve/torchserve_handler.py): JSON of many tiny items costs ~33
    # times its size as Python objects, so this bounds a worker's peak memory per request. null: no limit
    # but config.properties' max_request_size. The pod's gateway takes the same numbers per route.
    max_request_bytes: PerLane = None
    # Seconds one batch may run on a lane before its worker gives up (ends itself, so TorchServe answers the
    # batch's requests 500 and starts another): wall-clock seconds, but on a background lane on the CPU seconds its
    # worker ran (handlers/torchserve/lane_timeout.py, RunClock), so a chunk the stream lanes starve is slowed, not
    # failed. null: only TorchServe's responseTimeout, which 0.12 takes from the archive for every lane alike (a
    # wall-clock backstop of hours in this project's archives).
    response_timeout_s: PerLane = None
    # Read the frontend's messages through one buffer (handlers/torchserve/worker_protocol.py) instead of TorchServe's
    # recv per field: a fifth of the worker's time per request, and no copy of a large body beyond its size.
    # false: TorchServe's own reader.
    fast_protocol: bool = True
    # glibc's mmap threshold in the worker, in MiB, per lane like torch_threads (handlers/host_memory.py); null:
    # 4. A block this large or larger is mapped for itself and given back when freed, so a stream worker's one-off
    # large blocks (a body, a long batch's activations) do not stay in it. A bulk lane's activations recur every
    # micro-batch, and mapping each anew costs its page faults every time (the digits core ran at half speed with
    # 4 MiB): its lane keeps them in the heap with a higher threshold, at most glibc's 32.
    mmap_threshold_mib: PerLane = None
    # Growth in MiB over a worker's resting size it keeps after a batch for the next one, per lane; null: the mmap
    # threshold. Past it the worker hands its free heap back (malloc_trim). A lane whose every pass needs more (an
    # image classifier's activations) sets it above that need, or each batch faults the pages in again.
    heap_slack_mib: PerLane = None
    # Micro-batches of one request run at once by a worker, per lane like torch_threads; null: one per CPU the
    # worker may use. Each pass runs on torch_threads threads, so a lane with several passes sets torch_threads 1.
    # A bulk lane on the CPU: passes of one thread each keep both cores busy without OpenMP's barriers, which stall
    # whenever the worker's other threads (the frontend's reader, the collector) take a core. On a GPU: one.
    forward_passes: PerLane = 1
    # interactive | background, or per lane ({lane: ..., default: ...}); null: lanes named *-bulk background, the
    # others interactive (handlers/priority.py). A background lane's worker runs every thread at SCHED_IDLE.
    priority: PerLanePriority = None
    # A background lane's longest pass, in ms, while a stream lane of its device is busy (handlers/yielding.py);
    # null: 1 on the CPU, 2 on a GPU; 0: no cooperative yield (no signal raised or read).
    yield_pass_ms: float | None = None
    # How long, in ms, a background lane's passes stay bounded after a stream lane's batch ends (handlers/yielding.py);
    # null or 0: only while a batch runs. Lower stream p99 beside a job, for a slower job (docs/priority.md).
    yield_linger_ms: float | None = None
    # On the CPU, a background lane whose model runs torch's operators (torch.export, TorchScript) also yields between
    # them near stream traffic (handlers/op_yield.py), and its passes are cut by their longest operator instead of
    # their whole time. false: whole passes are bounded, as ONNX and AOTInductor files' always are.
    yield_between_operators: bool = True
    task_options: Mapping[str, Any] = field(default_factory=dict)
    # -- GPU: CUDA graphs, weights cast once, attention kernels (handlers/device_settings.py) --
    device: DeviceSettings = field(default_factory=DeviceSettings)

    @classmethod
    def from_yaml(cls, model_yaml_config: Mapping[str, Any] | None, lane: str | None = None) -> HandlerSettings:
        """Build from TorchServe's parsed model-config.yaml (context.model_yaml_config), for `lane` (TorchServe's
        model name; None: the `default` entries, as an in-process core runs)."""
        section = (model_yaml_config or {}).get("handler")
        if not isinstance(section, Mapping):
            raise SettingsError("model-config.yaml has no 'handler:' section; it must name at least task and model_file")
        for key in ("task", "model_file"):
            if not section.get(key):
                raise SettingsError(f"model-config.yaml handler.{key} is required")
        settings = cls(
            task=str(section["task"]),
            model_file=str(section["model_file"]),
            max_batch_rows=_rows_per_pass(section.get("max_batch_rows", cls.max_batch_rows), lane),
            max_batch_tokens=_tokens_per_pass(section.get("max_batch_tokens", cls.max_batch_tokens), lane),
            precision=str(section.get("precision", cls.precision)),
            deterministic=section.get("deterministic", cls.deterministic),
            torch_threads=section.get("torch_threads", cls.torch_threads),
            max_request_rows=section.get("max_request_rows", cls.max_request_rows),
            max_request_bytes=section.get("max_request_bytes", cls.max_request_bytes),
            response_timeout_s=section.get("response_timeout_s", cls.response_timeout_s),
            fast_protocol=section.get("fast_protocol", cls.fast_protocol),
            mmap_threshold_mib=section.get("mmap_threshold_mib", cls.mmap_threshold_mib),
            heap_slack_mib=section.get("heap_slack_mib", cls.heap_slack_mib),
            forward_passes=section.get("forward_passes", cls.forward_passes),
            priority=section.get("priority", cls.priority),
            yield_pass_ms=section.get("yield_pass_ms", cls.yield_pass_ms),
            yield_linger_ms=section.get("yield_linger_ms", cls.yield_linger_ms),
            # null, as the other yield settings: the default (true).
            yield_between_operators=_or_default(section.get("yield_between_operators"), cls.yield_between_operators),
            task_options={k: v for k, v in section.items() if k not in CORE_KEYS and k not in DEVICE_KEYS},
            device=DeviceSettings.from_section(section),
        )
        settings.check()
        settings.device.check_with(settings.precision, settings.model_file, settings.task_options.get("max_seq_length"))
        return settings

    def check(self) -> None:
        if not isinstance(self.max_batch_rows, int) or isinstance(self.max_batch_rows, bool) or self.max_batch_rows < 1:
            raise SettingsError(f"handler.max_batch_rows must be a positive integer, got {self.max_batch_rows!r}")
        _check_per_lane("max_batch_tokens", self.max_batch_tokens)
        if self.precision not in PRECISIONS:
            raise SettingsError(f"handler.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        _check_per_lane("torch_threads", self.torch_threads)
        _check_per_lane("max_request_rows", self.max_request_rows)
        _check_per_lane("max_request_bytes", self.max_request_bytes)
        _check_per_lane("response_timeout_s", self.response_timeout_s)
        _check_per_lane("mmap_threshold_mib", self.mmap_threshold_mib)
        _check_per_lane("heap_slack_mib", self.heap_slack_mib)
        _check_per_lane("forward_passes", self.forward_passes)
        mmap = self.mmap_threshold_mib
        values = mmap.values() if isinstance(mmap, Mapping) else [mmap]
        if any(mib is not None and mib > MAX_MMAP_THRESHOLD_MIB for mib in values):
            raise SettingsError(
                f"handler.mmap_threshold_mib is at most {MAX_MMAP_THRESHOLD_MIB} (glibc's limit), got {self.mmap_threshold_mib!r}"
            )
        check_priority(self.priority)
        for key in ("yield_pass_ms", "yield_linger_ms"):
            ms = getattr(self, key)
            if ms is not None and (isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0):
                raise SettingsError(f"handler.{key} must be a number of milliseconds >= 0 or null, got {ms!r}")
        if not isinstance(self.deterministic, bool):
            raise SettingsError(f"handler.deterministic must be true or false, got {self.deterministic!r}")
        if not isinstance(self.yield_between_operators, bool):
            raise SettingsError(f"handler.yield_between_operators must be true or false, got {self.yield_between_operators!r}")
        if not isinstance(self.fast_protocol, bool):
            raise SettingsError(f"handler.fast_protocol must be true or false, got {self.fast_protocol!r}")

    def threads_for(self, lane: str) -> int | None:
        """torch threads for a worker of `lane` (TorchServe's model name), None for torch's default."""
        return _for_lane(self.torch_threads, lane)

    def rows_for(self, lane: str) -> int | None:
        """The most rows one request may carry on `lane`, None for no limit."""
        return _for_lane(self.max_request_rows, lane)

    def named_lanes_rows(self) -> dict[str, int | None]:
        """{lane: row limit} for the lanes max_request_rows names: where a request too large for one lane may go."""
        return _named_lanes(self.max_request_rows)

    def bytes_for(self, lane: str) -> int | None:
        """The most bytes one request's body may have on `lane`, None for no limit of the handler's."""
        return _for_lane(self.max_request_bytes, lane)

    def named_lanes_bytes(self) -> dict[str, int | None]:
        return _named_lanes(self.max_request_bytes)

    def mmap_threshold_bytes(self, lane: str) -> int | None:
        """glibc's mmap threshold in bytes for a worker of `lane` (handlers/host_memory.py), None for its default."""
        return _mib_as_bytes(_for_lane(self.mmap_threshold_mib, lane))

    def heap_slack_bytes(self, lane: str) -> int | None:
        """What a worker of `lane` keeps over its resting size after a batch (handlers/host_memory.py), None for one
        mmap threshold."""
        return _mib_as_bytes(_for_lane(self.heap_slack_mib, lane))

    def passes_for(self, lane: str) -> int | None:
        """Micro-batches a worker of `lane` runs at once, None for one per usable CPU."""
        return _for_lane(self.forward_passes, lane)

    def priority_for(self, lane: str | None) -> str:
        """interactive or background for a worker of `lane` (handlers/priority.py)."""
        return priority_for(self.priority, lane)

    def yield_pass_s(self) -> float | None:
        """A background lane's pass bound in seconds while stream lanes are busy; None: the device's default; 0: off."""
        return None if self.yield_pass_ms is None else self.yield_pass_ms / 1000

    def yield_linger_s(self) -> float:
        """Seconds a background lane's passes stay bounded after a stream batch ends; 0: only while one runs."""
        return (self.yield_linger_ms or 0) / 1000

    def timeout_for(self, lane: str) -> int | None:
        """Seconds a batch may run on `lane` before its worker ends itself, None to leave it to TorchServe."""
        return _for_lane(self.response_timeout_s, lane)


def _or_default(value: Any, default: Any) -> Any:
    """A setting given as null (or left out): its default."""
    return default if value is None else value


def _rows_per_pass(value: Any, lane: str | None) -> Any:
    """max_batch_rows for `lane`: a per-lane mapping needs a positive integer for every lane it names and a
    `default` (check() then refuses anything but a positive integer)."""
    if not isinstance(value, Mapping):
        return value
    if DEFAULT_LANE not in value or any(rows is None for rows in value.values()):
        raise SettingsError(f"handler.max_batch_rows per lane needs a number for each lane and a default, got {dict(value)!r}")
    return value.get(lane, value[DEFAULT_LANE]) if lane is not None else value[DEFAULT_LANE]


def _tokens_per_pass(value: PerLane, lane: str | None) -> int | None:
    """max_batch_tokens for `lane`, every lane's value checked first (a typo in another lane's fails here too)."""
    _check_per_lane("max_batch_tokens", value)
    return _for_lane(value, lane or DEFAULT_LANE)


def _named_lanes(value: PerLane) -> dict[str, int | None]:
    if not isinstance(value, Mapping):
        return {}
    return {lane: limit for lane, limit in value.items() if lane != DEFAULT_LANE}


def _for_lane(value: PerLane, lane: str) -> int | None:
    if isinstance(value, Mapping):
        return value.get(lane, value.get(DEFAULT_LANE))
    return value


def _mib_as_bytes(mib: int | None) -> int | None:
    return mib * 2**20 if mib else None


def _check_per_lane(key: str, value: PerLane) -> None:
    counts = value.values() if isinstance(value, Mapping) else [value]
    if any(count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1) for count in counts):
        raise SettingsError(f"handler.{key} must be a positive integer or {{lane: positive integer or null}}, got {value!r}")
