"""The inference core: rows in, results out, in micro-batches under torch.inference_mode(). No `ts` import."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from handlers import cuda_graphs
from handlers.decoding import Payload
from handlers.errors import RequestError, SettingsError, is_out_of_memory, out_of_resources
from handlers.model_files import compiled_precision, runs_under_autocast
from handlers.op_yield import point
from handlers.settings import HandlerSettings
from handlers.tasks import build_task
from handlers.tasks.base import Task
from handlers.yielding import YieldingPasses

logger = logging.getLogger(__name__)

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Response:
    """One answer per request: a status code and a JSON-ready body."""

    status: int
    body: Any
    rows: int = 0


@dataclass
class StageTimes:
    """Where one answer() call spent its time, in seconds, and how its rows ran: filled in by the core, turned
    into metrics and a debug line by the adapter (handlers/torchserve/metrics.py). Plain numbers: no cost beyond a clock read."""

    decode: float = 0.0  # request items -> rows (the adapter adds its JSON parsing of the bodies)
    collate: float = 0.0  # rows -> a device batch
    forward: float = 0.0  # the forward pass and the copy of its outputs back to the CPU
    encode: float = 0.0  # outputs -> per-row results -> per-request bodies (the adapter adds JSON serialization)
    forward_rows: list[int] = field(default_factory=list)  # rows in each forward pass that completed
    oom_splits: int = 0  # times an out-of-memory halved the micro-batch

    def add_passes(self, passes: Sequence[StageTimes], wall: float) -> None:
        """Passes that ran at once, `wall` seconds in all: their collate, forward and encode times are shares of that
        wall time in the proportions the passes spent (so the stages still add up to the batch's time)."""
        spent = sum(p.collate + p.forward + p.encode for p in passes)
        scale = wall / spent if spent > 0 else 0.0
        self.collate += sum(p.collate for p in passes) * scale
        self.forward += sum(p.forward for p in passes) * scale
        self.encode += sum(p.encode for p in passes) * scale
        for p in passes:
            self.forward_rows.extend(p.forward_rows)


def select_device(gpu_id: int | str | None) -> torch.device:
    """`cuda:<gpu_id>` when TorchServe assigned a GPU and CUDA is usable, else the CPU."""
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{int(gpu_id)}")
    return torch.device("cpu")


class InferenceCore:
    """One model on one device; serves TorchServe, the in-process batch runner and the tests alike."""

    def __init__(self, task: Task, model: Any, device: torch.device, settings: HandlerSettings) -> None:
        self.task = task
        self.model = model
        self.device = device
        self.settings = settings
        self.autocast_dtype = self._autocast_dtype()
        if device.type == "cuda" and settings.precision == "fp32":
            # fp32 means fp32: cuDNN's convolutions default to TF32 on Ampere and later, which moved the digits
            # probabilities by up to 3e-4 from the CPU's on an H200 (docs/gpu.md); matmuls already default to fp32.
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        # Out-of-memory errors seen by the CUDA caching allocator so far (see _ran_out_of_memory).
        self._device_ooms = _device_ooms(device)
        # CUDA: copy batches from pinned host memory with non_blocking (overlaps with queued GPU work). A switch
        # for measuring it (scripts/gpu/check.py), on by default.
        self.pinned_copies = True
        # Micro-batches of one call run at once on these threads (run_passes_at_once); None: one after the other.
        self._passes: ThreadPoolExecutor | None = None
        self._passes_at_once = 1
        # A background lane's cooperative yield (handlers/yielding.py); None: rows run as they come.
        self.yielding: YieldingPasses | None = None
        # -- GPU settings (handlers/device_settings.py): weights cast once, attention kernels, CUDA graphs --
        self.input_dtype = AUTOCAST_DTYPES[settings.precision] if settings.device.cast_weights else None
        settings.device.apply_sdpa_backends(device)
        self.graphs: cuda_graphs.GraphRunner | None = None  # capture_graphs

    def capture_graphs(self, max_rows: int) -> cuda_graphs.GraphRunner | None:
        """Capture the forward pass for every bucket up to `max_rows` rows (the lane's batchSize), on the calling
        thread; batches run through the graphs from then on. None on a CPU, which runs eagerly."""
        if self.device.type != "cuda":
            logger.warning("cuda_graphs is on but this worker runs on %s: running eagerly", self.device)
            return None
        item = self.task.GRAPH_EXAMPLE_ITEM
        if item is None:
            raise SettingsError(f"handler.cuda_graphs: task {self.task.name} cannot capture graphs (no example row)")
        rows = cuda_graphs.batch_buckets(min(max_rows, self.settings.max_batch_rows))
        max_seq_length = self.task.max_seq_length
        lengths = None
        if max_seq_length is not None:
            lengths = self.settings.device.graph_sequence_buckets or cuda_graphs.sequence_buckets(max_seq_length)
        example = self.task.collate([self.task.decode_instance(item)], None)

        def forward(batch):
            with self._autocast():
                return self.task.forward(self.model, batch)

        buckets = cuda_graphs.all_buckets(rows, lengths)
        self.graphs = cuda_graphs.GraphRunner(forward, self.device, buckets, example, self.input_dtype)
        shapes = ", ".join(map(str, buckets))
        logger.info("captured %d CUDA graphs (%s), %.1f MiB", len(buckets), shapes, self.graphs.memory_bytes / 2**20)
        return self.graphs

    def run_passes_at_once(self, passes: int) -> int:
        """Run up to `passes` micro-batches of one predict() at once, each on the calling pool thread (torch's own
        thread count applies within each: set it to 1). On the CPU only: a device runs one pass at a time anyway.
        Returns the number in effect.

        A bulk request of thousands of rows on a 2-core CPU: two passes of one thread each instead of one of two, no
        OpenMP barrier for the worker's other threads to stall (docs/batch-jobs.md,
        "Throughput")."""
        if passes <= 1 or self.device.type != "cpu":
            return 1
        self._passes = ThreadPoolExecutor(max_workers=passes, thread_name_prefix="pass")
        self._passes_at_once = passes
        return passes

    @classmethod
    def load(cls, model_dir: str | Path, settings: HandlerSettings, device: torch.device) -> InferenceCore:
        built = compiled_precision(Path(settings.model_file)) or "fp32"
        if settings.precision == "int8" and built != "int8":
            # int8 cannot be switched on at run time: it is the quantized file itself.
            raise SettingsError(
                f"handler.precision int8 is built into the model file (make archive FORMAT=onnx PRECISION=int8), "
                f"but {settings.model_file} is {built}"
            )
        task = build_task(settings)
        model = task.load_model(Path(model_dir) / settings.model_file, device)
        return cls(task, model, device, settings)

    # -- requests -------------------------------------------------------------------------------

    def answer(self, payloads: Sequence[Payload | RequestError], stages: StageTimes | None = None) -> list[Response]:
        """Exactly one Response per payload, in order. A bad payload fails alone. Stage times go into `stages`."""
        stages = stages if stages is not None else StageTimes()
        started = time.perf_counter()
        responses: list[Response | None] = [None] * len(payloads)
        rows: list[Any] = []
        spans: list[tuple[int, int, int]] = []  # (request index, first row, row count)
        together = self._decode_together(payloads)
        for index, payload in enumerate(payloads):
            try:
                if isinstance(payload, RequestError):
                    raise payload
                decoded = together[index] if index in together else self.decode(payload)
            except RequestError as error:
                responses[index] = Response(error.code, error.to_dict())
                continue
            spans.append((index, len(rows), len(decoded)))
            rows.extend(decoded)
        stages.decode += time.perf_counter() - started
        results = self.predict(rows, stages) if rows else []
        regrouping = time.perf_counter()
        for index, first, count in spans:
            chunk = results[first : first + count]
            failed = next((position for position, result in enumerate(chunk) if isinstance(result, RequestError)), None)
            if failed is not None:  # a row that does not fit even alone fails its own request, no other
                error = chunk[failed] if payloads[index].raw else chunk[failed].at_row(failed)
                responses[index] = Response(error.code, error.to_dict(), count)
            else:
                body = chunk[0] if payloads[index].raw else {"predictions": chunk}
                responses[index] = Response(200, body, count)
        stages.encode += time.perf_counter() - regrouping
        return responses  # type: ignore[return-value]

    def _decode_together(self, payloads: Sequence[Payload | RequestError]) -> dict[int, list[Any]]:
        """{request index: rows} for the plain instances of several requests decoded in one vectorised pass: a stream
        batch of one-row requests pays numpy's fixed cost once instead of once per request (6.7 -> 2.3 µs a row for
        32 digits rows). {} when the task has no such pass or any item is not plain: each request is then decoded
        alone, so a bad item still fails its own request only, with the same message; so is a batch of more rows than
        max_batch_rows."""
        plain = [index for index, payload in enumerate(payloads) if isinstance(payload, Payload) and not payload.raw]
        # Only a stream batch's few rows: a bulk batch's requests (thousands of rows each) are decoded one at a time,
        # so the worker never holds every request's float64 grids at once.
        if len(plain) < 2 or sum(len(payloads[i].items) for i in plain) > self.settings.max_batch_rows:
            return {}
        many = self.task.decode_many([item for index in plain for item in payloads[index].items])
        if many is None:
            return {}
        together, first = {}, 0
        for index in plain:
            count = len(payloads[index].items)
            together[index] = many[first : first + count]
            first += count
        return together

    def decode(self, payload: Payload) -> list[Any]:
        # Limits that span a request's items (the digits task's pixel budget) live in a per-request decoder.
        task = self.task.for_request()
        if payload.raw:
            return [_decoded(task.decode_raw, payload.items[0])]
        # Optional: all items at once, vectorised, when they are all of the task's plain kind (None otherwise).
        many = task.decode_many(payload.items)
        if many is not None:
            return many
        rows = []
        for position, item in enumerate(payload.items):
            try:
                rows.append(_decoded(task.decode_instance, item))
            except RequestError as error:
                raise error.at_row(position) from None
        return rows

    # -- rows -----------------------------------------------------------------------------------

    def predict(self, rows: Sequence[Any], stages: StageTimes | None = None) -> list[Any]:
        """Results for `rows` in their order; a background lane's rows in slices short while stream lanes are busy."""
        stages = stages if stages is not None else StageTimes()
        if self.yielding is None or len(rows) <= 1:
            return self._predict(rows, stages)
        if self._passes is None:
            return self.yielding.run(rows, self.task.row_cost, lambda part: self._predict(part, stages))
        # Several pass threads: each takes its own slices (of max_batch_rows at most: one micro-batch, run on it).
        passes: list[StageTimes] = []

        def one_pass(part: list[Any]) -> list[Any]:
            times = StageTimes()
            passes.append(times)
            return self._predict(part, times)

        started = time.perf_counter()
        step = self.settings.max_batch_rows
        results = self.yielding.run_pulled(rows, self.task.row_cost, one_pass, self._passes, self._passes_at_once, step)
        stages.add_passes(passes, time.perf_counter() - started)
        stages.oom_splits += sum(times.oom_splits for times in passes)
        return results

    def _predict(self, rows: Sequence[Any], stages: StageTimes | None = None) -> list[Any]:
        """Results for `rows` in their order, run in micro-batches of at most max_batch_rows (and max_batch_tokens).

        Rows are grouped by cost (similar lengths together) and the results put back in input order.
        Out of device memory, a micro-batch is split in halves and each half retried, and later micro-batches
        start at the size that fitted. A row that does not fit even alone gets an OutOfResources RequestError
        (507) in its place in the results: only the requests holding such a row fail (answer() sees to it).
        """
        stages = stages if stages is not None else StageTimes()
        order = sorted(range(len(rows)), key=lambda i: self.task.row_cost(rows[i]))
        results: list[Any] = [None] * len(rows)
        step = self.settings.max_batch_rows
        pending: list[list[int]] = []  # micro-batches split after an out-of-memory, run before new ones
        start = 0
        if self._passes is not None and len(order) > step:
            pending = self._run_at_once(rows, order, results, stages, step)
            start = len(order)
        while pending or start < len(order):
            if pending:
                chunk = pending.pop()
                if len(chunk) > step:  # split before a smaller step was learned: run it at that step
                    pending.extend(chunk[i : i + step] for i in reversed(range(0, len(chunk), step)))
                    continue
            else:
                chunk = self._next_chunk(rows, order[start : start + step])
                start += len(chunk)
            try:
                outputs = self._run([rows[i] for i in chunk], stages, pad_to=step)
            except Exception as error:
                if not self._ran_out_of_memory(error):
                    raise
                self._release_memory()
                if len(chunk) == 1:
                    logger.warning(
                        "out of memory (%s) for a single row (cost %d): it fails alone",
                        type(error).__name__,
                        self.task.row_cost(rows[chunk[0]]),
                    )
                    results[chunk[0]] = out_of_resources("out of device memory for this row even alone; send it smaller")
                    continue
                half = (len(chunk) + 1) // 2
                step = min(step, half)
                stages.oom_splits += 1
                logger.warning(
                    "out of memory (%s) at %d rows: retrying in micro-batches of %d", type(error).__name__, len(chunk), half
                )
                pending.extend([chunk[half:], chunk[:half]])  # the first half runs first (pop from the end)
                continue
            for i, result in zip(chunk, outputs, strict=True):
                results[i] = result
        return results

    def _run_at_once(
        self, rows: Sequence[Any], order: list[int], results: list[Any], stages: StageTimes, step: int
    ) -> list[list[int]]:
        """Every micro-batch of `order` (row indexes by cost), several at once on the pass threads; their results go
        into `results`. Returns the micro-batches that ran out of memory, for predict's halving path (first one last)."""
        chunks, start = [], 0
        while start < len(order):
            chunks.append(self._next_chunk(rows, order[start : start + step]))
            start += len(chunks[-1])

        def run(chunk: list[int]) -> tuple[list[Any] | None, StageTimes]:
            times = StageTimes()
            try:
                return self._run([rows[i] for i in chunk], times, pad_to=step), times
            except Exception as error:
                if not self._ran_out_of_memory(error):
                    raise
                return None, times

        started = time.perf_counter()
        ran = list(self._passes.map(run, chunks))
        stages.add_passes([times for _, times in ran], time.perf_counter() - started)
        out_of_memory = []
        for chunk, (outputs, _) in zip(chunks, ran, strict=True):
            if outputs is None:
                out_of_memory.append(chunk)
                continue
            for i, result in zip(chunk, outputs, strict=True):
                results[i] = result
        return out_of_memory[::-1]

    def _next_chunk(self, rows: Sequence[Any], candidates: list[int]) -> list[int]:
        """The first of `candidates` (row indexes, in ascending cost) that fit max_batch_tokens: a pass pads every row
        to its last (longest) one, so k rows cost k times the k-th row's cost. At least one row, whatever it costs."""
        budget = self.settings.max_batch_tokens
        if budget is None:
            return candidates
        count = 1
        while count < len(candidates) and (count + 1) * self.task.row_cost(rows[candidates[count]]) <= budget:
            count += 1
        return candidates[:count]

    def _run(self, rows: list[Any], stages: StageTimes, pad_to: int) -> list[Any]:
        # Deterministic mode pads every micro-batch to the current step (max_batch_rows until an
        # out-of-memory halves it): the shape, hence the kernels and the result, do not depend on the
        # other rows, and a halved step really halves the memory.
        started = time.perf_counter()
        batch = self.task.collate(rows, pad_to if self.settings.deterministic else None)
        point()  # a bulk pass's yield point (handlers/op_yield.py) after the collate's operators, as after the model's
        collated = time.perf_counter()
        outputs = self.graphs.replay(batch) if self.graphs is not None else None  # None: no bucket holds it
        if outputs is None:
            batch = self._to_device(batch)
            with torch.inference_mode(), self._autocast(), self._pass_threads():
                outputs = self.task.forward(self.model, batch)
        outputs = outputs[: len(rows)].float().cpu()  # waits for the device: the forward time is real
        computed = time.perf_counter()
        point()
        results = self.task.unbatch(outputs, rows)
        stages.collate += collated - started
        stages.forward += computed - collated
        stages.encode += time.perf_counter() - computed
        stages.forward_rows.append(len(rows))
        if len(results) != len(rows):
            raise RuntimeError(f"task {self.task.name} returned {len(results)} results for {len(rows)} rows")
        return results

    def _to_device(self, batch: Any) -> Any:
        if self.input_dtype is not None:  # weights cast once: float inputs follow them
            cast = lambda t: t.to(self.input_dtype) if t.is_floating_point() else t  # noqa: E731
            batch = {key: cast(value) for key, value in batch.items()} if isinstance(batch, dict) else cast(batch)
        if self.device.type != "cuda":
            return batch
        # Pinned host memory lets the copy overlap with work already queued on the GPU.
        if self.pinned_copies:
            move = lambda t: t.pin_memory().to(self.device, non_blocking=True)  # noqa: E731
        else:
            move = lambda t: t.to(self.device)  # noqa: E731
        if isinstance(batch, dict):
            return {key: move(value) for key, value in batch.items()}
        return move(batch)

    def _pass_threads(self):
        """Deterministic mode on the CPU: the pass on one intra-op thread, whatever the caller's thread count. MKL's
        sgemm splits a product differently by thread count on some CPUs (AVX-512 Xeons: the digits CNN's 1024->128
        layer at 32 rows and more differed by up to 7e-7 between 1 and 2 threads), so a thread count is part of a
        pass's shape. The caller's count is set back after the pass (torch also takes it as the default of threads
        that have not run an op yet). An ONNX session keeps the threads it was made with (handlers/model_files.py)."""
        if not self.settings.deterministic or self.device.type != "cpu" or torch.get_num_threads() == 1:
            return contextlib.nullcontext()
        return torch_threads(1)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _autocast_dtype(self) -> torch.dtype | None:
        """Decided once at load: bf16 autocast on CUDA or the CPU, fp16 on CUDA only, for models autocast
        reaches (torch.export, TorchScript). Compiled files (AOTInductor, ONNX) carry their precision in
        the file (built from the same setting, e.g. digits.bf16.aoti.pt2), as does int8: nothing to switch
        here. A precision that cannot apply (fp16 on a CPU, bf16 asked of an fp32 compiled file) runs as
        the file is, with a warning."""
        dtype = AUTOCAST_DTYPES.get(self.settings.precision)
        if dtype is None or self.settings.device.cast_weights:
            return None
        model_file = Path(self.settings.model_file)
        if not runs_under_autocast(model_file):
            if compiled_precision(model_file) != self.settings.precision:
                logger.warning(
                    "%s is a compiled file built at %s; precision %s must be built in (make archive FORMAT=... PRECISION=...)",
                    model_file.name,
                    compiled_precision(model_file) or "fp32",
                    self.settings.precision,
                )
            return None
        if self.device.type == "cpu" and dtype is torch.float16:
            logger.warning("precision fp16 is for CUDA; running %s in fp32 on the CPU", model_file.name)
            return None
        return dtype if self.device.type in ("cpu", "cuda") else None

    def _ran_out_of_memory(self, error: Exception) -> bool:
        """Whether `error` comes from an allocation that failed. Read from the error itself, or, on CUDA, from the
        caching allocator's own count: AOTInductor's CUDA runtime reports an out-of-memory only as "run_func_(...)
        API call failed" (the allocator's message goes to stderr), but the allocator counts it."""
        ooms = _device_ooms(self.device)
        counted, self._device_ooms = ooms > self._device_ooms, ooms
        return is_out_of_memory(error) or counted

    def _release_memory(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


@contextlib.contextmanager
def torch_threads(count: int):
    """torch's intra-op threads at `count` for the block, as before after it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _device_ooms(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return int(torch.cuda.memory_stats(device).get("num_ooms", 0))


def _decoded(decode: Callable[[Any], Any], item: Any) -> Any:
    """One item through a task's decoder. Whatever a decoder or tokenizer raises on one item (a library's
    TypeError on a lone surrogate, say) is that item's 400, never its batch's failure."""
    try:
        return decode(item)
    except RequestError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure here belongs to this one item
        raise RequestError(f"the item could not be decoded: {type(error).__name__}: {str(error)[:200]}") from None
