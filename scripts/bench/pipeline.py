"""The ceiling and the CPU limit: the in-process pipeline's CPU cost per request, and a server's CPU cost
per request under load (its process tree's CPU time over the requests it served).

The pipeline is what a worker runs per TorchServe batch: decode each request's body, collate, forward,
unbatch and JSON-encode each answer, through the core loaded from the archive, on one torch thread.
CPU limit (requests/s) = cores / (the no-op lane's CPU s per request + the pipeline's CPU s per request).
"""

from __future__ import annotations

import base64
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import psutil
import torch

from handlers.decoding import read_body
from scripts.archive.core import load_core


@dataclass(frozen=True, slots=True)
class Timed:
    """`count` things (requests, rows) done in `seconds` of wall clock."""

    count: int
    seconds: float

    @property
    def per_second(self) -> float:
        """The wall-clock rate (requests/s, rows/s)."""
        return self.count / self.seconds


@dataclass(frozen=True)
class PipelineResult(Timed):
    """`count` requests in batches of `batch`, on one thread; `cpu_s` of this process's CPU."""

    batch: int = 1
    cpu_s: float = 0.0
    requests_per_second = Timed.per_second

    @property
    def cpu_ms_per_request(self) -> float:
        return self.cpu_s / self.count * 1000


@dataclass(frozen=True)
class ServerCpu:
    requests: int
    cpu_s: float  # user + system of the server's whole process tree (frontend and workers)

    @property
    def cpu_ms_per_request(self) -> float:
        return self.cpu_s / max(self.requests, 1) * 1000


def cpu_limit(cores: int, floor_cpu_ms: float, pipeline_cpu_ms: float) -> float:
    """Requests/s the machine could serve if its cores did nothing but the floor's and the pipeline's work."""
    return cores * 1000.0 / (floor_cpu_ms + pipeline_cpu_ms)


def pipeline(archive: Path, body: bytes, batch: int, seconds: float = 3.0, threads: int = 1) -> PipelineResult:
    """Batches of `batch` copies of `body` through decode -> collate -> forward -> unbatch -> JSON, for `seconds`."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        core = load_core(archive)
        parsed = orjson.loads(body)  # TorchServe hands an application/json body over parsed

        def one_batch() -> None:
            for answer in core.answer([read_body(parsed) for _ in range(batch)]):
                orjson.dumps(answer.body)

        for _ in range(10):
            one_batch()
        calls, cpu_before, started = 0, _own_cpu(), time.perf_counter()
        while time.perf_counter() - started < seconds:
            one_batch()
            calls += 1
        return PipelineResult(calls * batch, time.perf_counter() - started, batch=batch, cpu_s=_own_cpu() - cpu_before)
    finally:
        torch.set_num_threads(previous)


IMAGE_STAGES = ("base64", "image decode", "resize and crop", "collate", "forward", "top 5 and JSON")


def image_stages(archive: Path, body: bytes, seconds: float = 2.0) -> dict[str, float] | None:
    """Where one image's milliseconds go in process, one thread, batch 1 (means over `seconds` of repeats): the
    stages of an image task's decode apart (base64, the image's decode to RGB, the resize and crop), then collate
    (normalisation), forward and the answer. None for a task that does not decode images."""
    from handlers.tasks.image_classification import ImageClassification

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        core = load_core(archive)
        if not isinstance(core.task, ImageClassification):
            return None
        encoded = orjson.loads(body)["instances"][0]["b64"]
        spent = dict.fromkeys(IMAGE_STAGES, 0.0)
        rounds, started = 0, time.perf_counter()
        while rounds < 3 or time.perf_counter() - started < seconds:
            task = core.task.for_request()  # a request's own pixel budget
            clock = time.perf_counter()
            data = base64.b64decode(encoded, validate=True)
            marks = [clock, time.perf_counter()]
            image = task.decoded(data)
            marks.append(time.perf_counter())
            row = task.resized_crop(image)
            marks.append(time.perf_counter())
            batch = task.collate([row], None)
            marks.append(time.perf_counter())
            with torch.inference_mode():
                outputs = task.forward(core.model, batch)
            marks.append(time.perf_counter())
            orjson.dumps({"predictions": task.unbatch(outputs, [row])})
            marks.append(time.perf_counter())
            if rounds >= 2:  # the first passes warm caches and the program
                for stage, (begin, end) in zip(IMAGE_STAGES, zip(marks, marks[1:], strict=False), strict=True):
                    spent[stage] += end - begin
            rounds += 1
        return {stage: total * 1000 / (rounds - 2) for stage, total in spent.items()}
    finally:
        torch.set_num_threads(previous)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and all its descendants alive now."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def server_cpu(pid: int, load: Callable[[], int]) -> ServerCpu:
    """Run `load()` (it returns the requests served, e.g. a wrk closed loop) and charge the server tree's CPU to it."""
    before = tree_cpu_seconds(pid)
    requests = load()
    return ServerCpu(requests, tree_cpu_seconds(pid) - before)
