"""Live traffic beside a batch job: each model's stream lane alone, beside a full-speed job through its bulk lane and
beside an in-process job, in closed loop (wrk, 1/4/16 connections) and open loop (k6, 25/50/75% of the lane's own
capacity); the job's rows/s alone, beside the traffic, and against what the traffic left (the CPU the stream lane used
alone, read from /proc); the job alone against the same job with the mechanism off; how long a bulk lane keeps the
CPU after a stream lane wants it, as the bulk side counts it and as the stream lane's threads waited (perf sched,
scripts/bench/core_waits.py). Writes its section of docs/benchmarks.md and docs/bench/beside-<model>.png.

    python -m scripts.bench.beside [--quick] [--models NAME ...] [--no-report]   # default: every model
    python -m scripts.bench.beside --holds-only [--models NAME ...]   # only "How long a bulk lane keeps the CPU"
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from handlers.decoding import Payload
from handlers.lane_signal import LaneSignal
from handlers.priority import GOMP_SPINCOUNT, OMP_WAIT_POLICY
from handlers.torchserve.metrics import BATCH_ROWS
from handlers.yielding import YieldingPasses
from models import registry
from scripts import cli
from scripts.archive.core import load_core
from scripts.archive.variant import write_variant
from scripts.bench import core_waits, loadgen
from scripts.bench.attribution import scrape
from scripts.bench.report import machine, percentile, replace_section
from scripts.bench.stream import request_body
from scripts.jobs.example import write_example
from scripts.layout import MODEL_STORE, ROOT
from scripts.server.temporary import only_lanes_of, serving_in
from scripts.swap.management import ManagementApi

SECTION = "bench:beside"
HOLDS_SECTION = "bench:beside-holds"
HOLD_BOUND_MS = 1.0  # the issue's bound on the CPU
PLOTS = ROOT / "docs" / "bench"
JSON = "application/json"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The issue's targets: p99 and p50 beside a job against alone, the job's share of what the traffic left, its cost.
P99_BOUND, P50_BOUND, LEFT_BOUND, COST_BOUND = 1.2, 1.1, 0.9, 0.97
CONDITIONS = ("alone", "bulk lane job", "in-process job")
LIBGOMP_DEFAULT_SPINS = "300000"  # libgomp's spins before sleeping when OMP_WAIT_POLICY is unset: the mechanism off


@dataclass(frozen=True)
class Plan:
    connections: tuple[int, ...] = (1, 4, 16)
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75)
    seconds: float = 5.0
    warmup: float = 1.0
    # The job alone, no traffic, and the same job with the mechanism off, in turns of job_seconds / repeats: a turn of
    # 5 s held about 18 of the classifier's 16-image chunks, and a chunk more or less read as 5%.
    job_seconds: float = 20.0
    # The long job's length at the model's rate alone (model.yaml bench.job.rows_per_s): long enough to run through
    # every point without a restart (a restart's start-up, seconds without rows, would read as the job starved).
    long_job_s: float = 300.0
    probe_seconds: float = 4.0
    # Alone and beside alternate this many times at each load (the job paused, then resumed): a shared machine's
    # speed drifts by more than the targets' 10-20% over the minutes a model's points take, so each ratio compares
    # runs seconds apart; each cell is the mean of its runs. Three: with two, one run's outlier (a 22 ms p99 against
    # 12) decided a target; the full section then takes about 40 minutes on a 2-core machine.
    repeats: int = 3

    # A short job per condition run to its end beside 4 connections, its output checked: every row exactly once (the
    # long ones above are stopped when the points are done).
    checked_job_s: float = 3.0

    def rows(self, model: str) -> int:
        return math.ceil(job_rate(model) * self.long_job_s)

    def check_rows(self, model: str) -> int:
        return math.ceil(job_rate(model) * self.checked_job_s)


QUICK = Plan(seconds=2.0, warmup=0.5, job_seconds=5.0, long_job_s=75.0, probe_seconds=2.0, repeats=2)


def job_rate(model: str) -> int:
    """Rows/s of the model's bulk job alone here (model.yaml bench.job.rows_per_s): what sizes its jobs."""
    return registry.model(model).bench["job"]["rows_per_s"]


@dataclass
class Point:
    load: str  # "c=4" or "50%"
    condition: str
    p50_ms: float
    p99_ms: float
    rps: float
    errors: int
    stream_cpu_share: float | None = None  # alone: the machine's share the stream lane (workers + frontend) used
    machine_busy: float = 0.0  # the share of every core busy meanwhile, whoever used it (/proc/stat)
    job_rps: float | None = None  # beside: the job's rows/s during this point
    paired: str = ""  # alone: the condition whose runs it alternated with (its job paused meanwhile)


@dataclass
class ModelResult:
    model: str
    capacity_rps: float
    points: list[Point] = field(default_factory=list)
    job_alone: dict[str, float] = field(default_factory=dict)  # condition -> rows/s with no traffic
    baseline_rps: float | None = None  # the bulk lane job alone with the mechanism off
    jobs_checked: int = 0  # finished jobs whose output held every row exactly once
    jobs_failed: list[str] = field(default_factory=list)
    # The stream lane's threads' waits for a core in the first alone and bulk lane job runs of each closed loop, by
    # (load, condition, "workers" or "frontend") (scripts/bench/core_waits.py); why they were not measured, where not.
    waits: dict[tuple[str, str, str], core_waits.Waits] = field(default_factory=dict)
    waits_unavailable: str | None = None

    def point(self, load: str, condition: str, paired: str = CONDITIONS[1]) -> Point:
        """The mean of a load's runs in a condition; alone: those that alternated with `paired`."""
        runs = [p for p in self.points if p.load == load and p.condition == condition]
        if condition == "alone":
            runs = [p for p in runs if p.paired == paired]
        return mean_point(runs)


def mean_point(runs: list[Point]) -> Point:
    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    first = runs[0]
    return Point(
        first.load,
        first.condition,
        mean([p.p50_ms for p in runs]),
        mean([p.p99_ms for p in runs]),
        mean([p.rps for p in runs]),
        sum(p.errors for p in runs),
        stream_cpu_share=mean([p.stream_cpu_share for p in runs]),
        machine_busy=mean([p.machine_busy for p in runs]),
        job_rps=mean([p.job_rps for p in runs]),
        paired=first.paired,
    )


# -- the job ---------------------------------------------------------------------------------------------


def job_input(model: str, rows: int, folder: Path) -> Path:
    """`rows` rows of the model's samples, repeated with their own ids, as Parquet (scripts/jobs/example.py)."""
    path = folder / f"{model}-{rows}.parquet"
    return path if path.exists() else write_example(model, rows, path)


class JobLoop:
    """One job after another (python -m scripts.jobs.batch_job, as a user runs it) until stopped; the rows done
    so far read from each job's progress file, each finished job's output checked: every row exactly once."""

    def __init__(
        self,
        model: str,
        source: Path,
        folder: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        answered: Callable[[], float] | None = None,
    ) -> None:
        self.model, self.source, self.args = model, source, args
        self.answered = answered  # the rows its server's lane has answered so far (lane_rows), for a bulk lane job
        self.env = {**os.environ, **(env or {})}
        self.folder = Path(tempfile.mkdtemp(prefix=f"{model}-jobs-", dir=folder))  # no other loop's leftovers
        self.rows = pq.read_metadata(source).num_rows
        self.finished = 0
        self._lock = threading.Lock()  # the rows of finished jobs and the running job's output change together
        self._done_before = 0
        self._running_done = 0  # the running job's rows done at its last progress reading
        self.checked = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._go = threading.Event()  # cleared while paused: no job starts, the running one is stopped
        self._go.set()
        self._process: subprocess.Popen | None = None
        self._output: Path | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> JobLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.resume()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
        self._thread.join(timeout=120)
        shutil.rmtree(self.folder, ignore_errors=True)

    def rows_done(self) -> int:
        """Rows of the finished jobs and the running one's last progress. A job removes its progress file as it
        finishes, before this loop counts it finished: the running job's last reading stands meanwhile."""
        with self._lock:
            output = self._output
            if output is not None:
                with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
                    progress = orjson.loads(output.with_name(output.name + ".progress.json").read_bytes())["rows_done"]
                    self._running_done = max(self._running_done, progress)
            return self._done_before + (self._running_done if output is not None else 0)

    def rows_answered(self) -> float:
        """The rows its work has answered so far, to time its rate by: its server lane's count (`answered`) for a job
        sent to a bulk lane, else the rows it committed. A paused job's chunks in flight (up to --concurrency, 8) are
        answered while it is stopped and committed all at once when it resumes: counted by its commits, the first
        turn after a resume read rows computed before it. minilm's job alone read 0.80 of the same job with the
        mechanism off, which had one turn more after a resume, and beside 16 connections 5x what the traffic left
        (make bench, 2026-12-07). An in-process job computes in its own process: stopped, it computes nothing."""
        return self.answered() if self.answered is not None else self.rows_done()

    def pid(self) -> int | None:
        """The running job's process (its reader and writer), None between jobs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def pause(self) -> None:
        """The job's processes stopped (SIGSTOP): nothing more reaches its lane; what is in flight finishes."""
        with self._lock:
            self._go.clear()
            self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        with self._lock:
            self._signal(signal.SIGCONT)
            self._go.set()

    def _signal(self, number: int) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, number)

    def wait_started(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.rows_done() == 0 and time.monotonic() < deadline:
            time.sleep(0.1)

    def _loop(self) -> None:
        number = 0
        while not self._stop.is_set():
            output = self.folder / f"{self.model}-job-{number}.parquet"
            command = [sys.executable, "-m", "scripts.jobs.batch_job", "--model", self.model, "--input", str(self.source)]
            command += ["--output", str(output), "--overwrite", "--no-progress", *self.args]
            self._go.wait()
            with self._lock:
                self._output, self._running_done = output, 0
            # In the bench's session with the TorchServe it serves beside (process groups of their own): where the
            # kernel groups by session, idle priority orders threads within one (handlers/priority.py), as on a
            # machine or in a pod of their own; the other sessions of this shared machine get their fair share.
            self._process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, process_group=0
            )
            with self._lock:
                if not self._go.is_set():  # paused while it started
                    self._signal(signal.SIGSTOP)
            _, stderr = self._process.communicate()
            if self._stop.is_set():
                break
            with self._lock:
                self._done_before += self.rows if self._process.returncode == 0 else 0
                self._output = None
            if self._process.returncode != 0:
                self.failed.append(f"job {number} exited {self._process.returncode}: {stderr.decode()[-300:]}")
            else:
                self._check(output, number)
            self.finished += 1
            number += 1

    def _check(self, output: Path, number: int) -> None:
        ids = pq.read_table(output, columns=["id"]).column("id").to_pylist()
        expected = pq.read_table(self.source, columns=["id"]).column("id").to_pylist()
        if ids == expected:
            self.checked += 1
        else:
            self.failed.append(f"job {number}: {len(ids)} rows out, {len(set(ids))} distinct, {len(expected)} in")
        for path in output.parent.glob(output.name + "*"):
            path.unlink(missing_ok=True)


# -- the traffic -----------------------------------------------------------------------------------------


def process_cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / CLOCK_TICKS


def lane_rows(server, lane: str) -> float:
    """The rows `lane` of `server` has answered so far: the handler's HandlerBatchRows, counted as each batch ends."""
    return scrape(server).get((f"{BATCH_ROWS.name}_sum", lane), 0.0)


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot, from /proc/stat's first line."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


def stream_pids(server, model: str) -> list[int]:
    workers = list(ManagementApi(server.endpoints).worker_pids(model))
    stat = Path(f"/proc/{workers[0]}/stat").read_text()
    frontend = int(stat[stat.rindex(")") + 2 :].split()[1])
    return [*workers, frontend]


def measure(target: loadgen.Target, load: str, plan: Plan, capacity: float) -> loadgen.LoadResult:
    if load.startswith("c="):
        return loadgen.closed_loop(target, int(load[2:]), plan.seconds, warmup_s=plan.warmup)
    return loadgen.open_loop(target, capacity * int(load.rstrip("%")) / 100, plan.seconds)


def loads(plan: Plan) -> list[str]:
    return [f"c={c}" for c in plan.connections] + [f"{round(f * 100)}%" for f in plan.fractions]


def point_of(target, load: str, plan: Plan, capacity: float, condition: str, pids: list[int], job: JobLoop | None) -> Point:
    cpu, rows, started, ticks = process_cpu_s(pids), job.rows_answered() if job else 0, time.monotonic(), machine_busy_ticks()
    run = measure(target, load, plan, capacity)
    elapsed = time.monotonic() - started
    busy, total = (after - before for after, before in zip(machine_busy_ticks(), ticks, strict=True))
    point = Point(load, condition, run.p50_ms, run.p99_ms, run.rps, run.errors, machine_busy=busy / max(1, total))
    if job is None:
        point.stream_cpu_share = (process_cpu_s(pids) - cpu) / (elapsed * os.cpu_count())
    else:
        point.job_rps = max(0.0, job.rows_answered() - rows) / elapsed
    print(f"  {condition:15} {load:>5}: {run.row()}" + (f"  job {point.job_rps:,.0f} rows/s" if job else ""), flush=True)
    return point


def lane_capacity(target: loadgen.Target, seconds: float, warmup_s: float) -> float:
    """The stream lane's req/s at 16 connections (closed loop), which the open-loop loads are shares of, measured after
    a first run of the same length, discarded: measured first, right after start-up, digits read 1,129 req/s where its
    runs at 16 connections minutes later read 2,328 (2026-12-07 05:51). Warmed so it read 1,373 against 2,053-2,332
    later (07:00): better, still low, and why is not known; the section prints the rate each point ran at."""
    loadgen.closed_loop(target, 16, seconds, warmup_s=warmup_s)
    return loadgen.closed_loop(target, 16, seconds, warmup_s=warmup_s).rps


def wait_idle(pids, timeout: float = 30.0, window: float = 0.3) -> None:
    """Until the processes `pids()` names use no CPU for a window (a paused job's bulk requests in flight answered)."""
    deadline = time.monotonic() + timeout
    before = process_cpu_s(pids())
    while time.monotonic() < deadline:
        time.sleep(window)
        now = process_cpu_s(pids())
        if now - before <= 1.5 / CLOCK_TICKS:
            return
        before = now


def run_points(
    result: ModelResult, target, plan: Plan, condition: str, pids: list[int], job: JobLoop, drained, background=None
) -> None:
    """At each load, alone (the job paused, its lane drained) and beside it, alternately, plan.repeats times. With
    `background` (the pids of the job's processes and its lane's workers), the first alone and beside runs of each
    closed loop also record the stream lane's waits for a core (core_waits)."""
    for load in loads(plan):
        for repeat in range(plan.repeats):
            traced = background is not None and repeat == 0 and load.startswith("c=")
            job.pause()
            wait_idle(drained)
            with _waits_of(result, load, "alone", plan, pids, background, traced):
                alone = point_of(target, load, plan, result.capacity_rps, "alone", pids, None)
            alone.paired = condition
            job.resume()
            with _waits_of(result, load, condition, plan, pids, background, traced):
                beside = point_of(target, load, plan, result.capacity_rps, condition, pids, job)
            result.points += [alone, beside]


@contextlib.contextmanager
def _waits_of(result: ModelResult, load: str, condition: str, plan: Plan, pids: list[int], background, traced: bool):
    """The block's waits of the stream lane's threads for a core into result.waits, if `traced`. The background pids
    are read before and after the block: a job that ends meanwhile is followed by another process. A recording that
    fails stops the tracing for the model: the section says why."""
    if not traced or result.waits_unavailable is not None:
        yield
        return
    behind = set(background())
    with tempfile.TemporaryDirectory(prefix="perf-sched-") as folder:
        path = Path(folder) / "sched.data"
        with core_waits.recording(path, plan.warmup + plan.seconds) as recorded:
            yield
        try:
            if recorded.error is not None:
                raise RuntimeError(recorded.error)
            # stream_pids: the workers, then the frontend
            groups = {"workers": pids[:-1], "frontend": pids[-1:]}
            waits = core_waits.read_groups(path, groups, behind | set(background()))
        except (RuntimeError, subprocess.CalledProcessError) as error:
            result.waits_unavailable = f"perf failed at {load}, {condition}: {error}"
            print(f"  {result.waits_unavailable}", flush=True)
            return
    for group, found in waits.items():
        result.waits[(load, condition, group)] = found
        taken = found.after_background_ms
        print(
            f"  {condition:15} {load:>5}: {group}: waits for a core p99 {percentile(found.all_ms, 0.99):.3f} ms "
            f"({len(found.all_ms)}); from the bulk side p99 / max {percentile(taken, 0.99):.3f} / "
            f"{max(taken, default=float('nan')):.3f} ms ({len(taken)}); moved in {found.moved_in}",
            flush=True,
        )


def job_alone(job: JobLoop, seconds: float) -> float:
    rows, started = job.rows_answered(), time.monotonic()
    time.sleep(seconds)
    return (job.rows_answered() - rows) / (time.monotonic() - started)


def alternate_alone(jobs: dict[str, JobLoop], drained: dict[str, object], plan: Plan) -> dict[str, float]:
    """Each job's rows/s with no traffic, the jobs taking turns (the others paused and drained), plan.repeats times;
    every other round in the reverse order (A B, B A, ...), so that neither job always runs first after the set-up
    or always follows the same one."""
    rates: dict[str, list[float]] = {name: [] for name in jobs}
    for repeat in range(plan.repeats):
        turns = list(jobs.items())
        for name, job in reversed(turns) if repeat % 2 else turns:
            for other_name, other in jobs.items():
                if other is not job:
                    other.pause()
                    wait_idle(drained[other_name])
            job.resume()
            rates[name].append(job_alone(job, plan.job_seconds / plan.repeats))
    for job in jobs.values():
        job.resume()
    return {name: sum(values) / len(values) for name, values in rates.items()}


def bench_model(model: str, plan: Plan, workdir: Path) -> ModelResult:
    source = job_input(model, plan.rows(model), workdir)
    checked = job_input(model, plan.check_rows(model), workdir)
    body = request_body(model)
    server_job = ["--chunk-size", str(registry.model(model).bench["job"]["chunk_size"])]
    archives = {f"{model}.mar": MODEL_STORE / f"{model}.mar"}
    # The mechanism off (lanes interactive, no yield, OpenMP's default wait, the job at normal priority: what the bulk
    # lane ran at before), served beside from the start so that its job and the real one alternate.
    off_archive = write_variant(
        MODEL_STORE / f"{model}.mar", workdir / "off" / f"{model}.mar", {"priority": "interactive", "yield_pass_ms": 0}
    )
    lanes = only_lanes_of(f"{model}.mar")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(serving_in(workdir / "server", archives, lanes, own_session=False))
        with _environment(OMP_WAIT_POLICY, ""), _environment(GOMP_SPINCOUNT, LIBGOMP_DEFAULT_SPINS):
            off = stack.enter_context(serving_in(workdir / "off-server", {f"{model}.mar": off_archive}, lanes, own_session=False))
        endpoints = server.endpoints
        target = loadgen.Target(endpoints.prediction_url(model), body, JSON, endpoints.token("inference"))
        capacity = lane_capacity(target, plan.seconds, plan.warmup)
        result = ModelResult(model, capacity, waits_unavailable=core_waits.unavailable())
        print(f"{model}: capacity {capacity:,.0f} req/s at 16 connections", flush=True)
        pids = stream_pids(server, model)
        bulk = f"{model}-bulk"

        def bulk_workers(of=server) -> list[int]:
            return list(ManagementApi(of.endpoints).worker_pids(bulk))

        def nothing() -> list[int]:
            return []

        config = ["--config", str(server.config), "--key-file", str(endpoints.key_file)]
        off_config = ["--config", str(off.config), "--key-file", str(off.endpoints.key_file), "--normal-priority"]
        jobs = {
            "bulk lane job": ([*server_job, *config], bulk_workers),
            "in-process job": (["--in-process", "--chunk-size", server_job[1]], nothing),
        }
        for condition, (args, drained) in jobs.items():
            with contextlib.ExitStack() as running:
                answered = partial(lane_rows, server, bulk) if condition == "bulk lane job" else None
                job = running.enter_context(JobLoop(model, source, workdir, args, answered=answered))
                job.wait_started()
                if condition == "bulk lane job":
                    off_job = running.enter_context(
                        JobLoop(
                            model,
                            source,
                            workdir,
                            [*server_job, *off_config],
                            env={OMP_WAIT_POLICY: ""},
                            answered=partial(lane_rows, off, bulk),
                        )
                    )
                    off_job.wait_started()
                    rates = alternate_alone(
                        {condition: job, "off": off_job}, {condition: drained, "off": lambda: bulk_workers(off)}, plan
                    )
                    result.job_alone[condition], result.baseline_rps = rates[condition], rates["off"]
                    off_job.pause()
                    wait_idle(lambda: bulk_workers(off))
                    print(f"  bulk lane job alone, mechanism off: {result.baseline_rps:,.0f} rows/s", flush=True)
                else:
                    result.job_alone[condition] = job_alone(job, plan.job_seconds)
                print(f"  {condition} alone: {result.job_alone[condition]:,.0f} rows/s", flush=True)
                background = None
                if condition == "bulk lane job" and result.waits_unavailable is None:
                    background = partial(_background_pids, job, drained)
                run_points(result, target, plan, condition, pids, job, drained, background)
            check_finished(result, target, plan, condition, pids, JobLoop(model, checked, workdir, args))
    return result


def _background_pids(job: JobLoop, drained) -> list[int]:
    """The bulk lane's workers and the job's process: the threads at idle priority beside the stream lane."""
    return [*drained(), *([job.pid()] if job.pid() is not None else [])]


def check_finished(result: ModelResult, target, plan: Plan, condition: str, pids: list[int], job: JobLoop) -> None:
    """Run `job` beside 4 connections of traffic (points not kept) until one job has finished and been checked."""
    deadline = time.monotonic() + 300
    with job:
        while job.finished == 0 and time.monotonic() < deadline:
            point_of(target, "c=4", plan, result.capacity_rps, condition, pids, job)
        result.jobs_checked += job.checked
        result.jobs_failed += job.failed or ([] if job.finished else [f"{condition}: no job finished within 300 s"])


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


# -- how long the bulk lane keeps the CPU ------------------------------------------------------------------

RAISER = """
import random, sys, time
from pathlib import Path
from handlers.lane_signal import LaneSignal
signal = LaneSignal("cpu", Path(sys.argv[1])); signal.claim()
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    with signal.raised():
        time.sleep(random.uniform(0.005, 0.015))
    time.sleep(random.uniform(0.002, 0.020))
"""
# Seconds of work (at the model's job rate) in one bulk request of the hold measurement: it ends soon after the raisers.
HOLD_S = 0.5
RAISERS = 2  # two stream workers, rising independently: one rises while the other's rise has cut the passes

BUSY = """
import sys, time
from handlers.priority import enter_background
from scripts.archive.core import load_core
from scripts.bench.beside import bulk_rows
if sys.argv[3] == "idle":
    enter_background()
core = load_core(__import__("pathlib").Path(sys.argv[1]))
core.run_passes_at_once(2)
rows = bulk_rows(sys.argv[5], core, int(sys.argv[4]))
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    core.predict(rows)
"""


def bulk_rows(model: str, core, count: int) -> list:
    """`count` decoded rows of the model's samples, as a bulk request's would be."""
    return core.decode(Payload(registry.model(model).samples().request(count), raw=False))


@dataclass
class HoldResult:
    model: str
    bounded_ms: list[float]  # rose while the passes were bounded
    after_full_ms: list[float]  # rose during a full-size pass
    wake_ms: dict[str, list[float]]  # a normal thread's wake-up delay: nothing beside, the bulk core at normal, at idle


def holds(model: str, plan: Plan) -> HoldResult:
    """The cooperative bound (each pass thread's run from a rise to its next yield point, YieldStats) under a signal
    raised at random by other processes, and the OS's: how late a normal-priority thread wakes beside a full-speed
    bulk core at normal and at idle priority."""
    archive = MODEL_STORE / f"{model}.mar"
    core = load_core(archive)
    core.run_passes_at_once(2)
    count = max(4, math.ceil(job_rate(model) * HOLD_S))
    rows = bulk_rows(model, core, count)
    with tempfile.TemporaryDirectory(prefix="signal-") as folder:
        # As the lane's settings make it (between operators where its file runs torch's), the default bound if off.
        signal, full = LaneSignal("cpu", Path(folder)), core.settings.max_batch_rows * 2
        yielding = YieldingPasses.for_lane(signal, core.settings, full, on_cpu=True) or YieldingPasses(signal, full, True)
        core.yielding = yielding
        command = [sys.executable, "-c", RAISER, folder, str(plan.probe_seconds)]
        raisers = [subprocess.Popen(command, cwd=ROOT) for _ in range(RAISERS)]
        while any(raiser.poll() is None for raiser in raisers):
            core.predict(rows)
        core.yielding = None
    stats = yielding.stats
    wake = {"nothing beside": _wakeups(plan.probe_seconds)}
    for priority in ("normal", "idle"):
        command = [sys.executable, "-c", BUSY, str(archive), str(plan.probe_seconds + 3), priority, str(count), model]
        busy = subprocess.Popen(command, cwd=ROOT)
        time.sleep(2.5)  # the core loaded and running
        wake[f"bulk core at {priority}"] = _wakeups(plan.probe_seconds)
        busy.wait()
    return HoldResult(model, [h * 1000 for h in stats.holds_s], [h * 1000 for h in stats.holds_after_full_s], wake)


def _wakeups(seconds: float) -> list[float]:
    """ms past each 1 ms sleep of this (normal-priority) thread: how long it waited for a core once it woke."""
    late, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        time.sleep(0.001)
        late.append((time.perf_counter() - started - 0.001) * 1000)
    return late


# -- the report ------------------------------------------------------------------------------------------


def targets(result: ModelResult, plan: Plan) -> list[tuple[str, float, float, bool]]:
    """(what, ratio, bound, met): p99/p50 beside a bulk lane job at each load the issue names, what the job took."""
    rows = []
    for load in [f"c={c}" for c in plan.connections] + ["50%"]:
        alone, beside = result.point(load, "alone"), result.point(load, "bulk lane job")
        for name, a, b, bound in (
            ("p99", alone.p99_ms, beside.p99_ms, P99_BOUND),
            ("p50", alone.p50_ms, beside.p50_ms, P50_BOUND),
        ):
            ratio = b / a if a else float("nan")
            rows.append((f"{result.model} {name} beside a bulk lane job / alone, {load}", ratio, bound, ratio <= bound))
    job_rate = result.job_alone["bulk lane job"]
    for load in loads(plan):
        share = result.point(load, "alone").stream_cpu_share or 0.0
        beside = result.point(load, "bulk lane job").job_rps or 0.0
        ratio = beside / (job_rate * max(0.0, 1 - share)) if job_rate else float("nan")
        rows.append(
            (f"{result.model} job beside {load} / (its rate alone x (1 - {share:.2f}))", ratio, LEFT_BOUND, ratio >= LEFT_BOUND)
        )
    if result.baseline_rps:
        ratio = job_rate / result.baseline_rps
        rows.append((f"{result.model} job alone / the same with the mechanism off", ratio, COST_BOUND, ratio >= COST_BOUND))
    return rows


def plot(result: ModelResult, plan: Plan) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    points = loads(plan)
    for condition in CONDITIONS:
        for axis, key in zip(axes, ("p50_ms", "p99_ms"), strict=True):
            axis.plot(points, [getattr(result.point(load, condition), key) for load in points], marker="o", label=condition)
    for axis, name in zip(axes, ("p50", "p99"), strict=True):
        axis.set_title(f"{result.model} stream lane {name} (ms)")
        axis.set_xlabel("closed loop: connections; open loop: share of capacity")
        axis.set_yscale("log")
        axis.legend(fontsize=8)
    figure.tight_layout()
    PLOTS.mkdir(parents=True, exist_ok=True)
    path = PLOTS / f"beside-{result.model}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def section(results: list[ModelResult], plan: Plan, quick: bool) -> str:
    lines = [
        "## Live traffic beside a batch job",
        "",
        f"`python -m scripts.bench.beside{' --quick' if quick else ''}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{machine()}; a machine shared with other engineers' tests and builds while it ran (load average "
        f"{Path('/proc/loadavg').read_text().split()[2]} over 15 minutes at the end). Each model's stream lane "
        f"(one-row JSON, the lane's config.properties batching) alone, beside a full-speed job through its bulk lane "
        f"(`python -m scripts.jobs.batch_job`, Parquet in and out, restarted when it ends) and beside an `--in-process` "
        f"job; wrk closed loop, k6 open loop at shares of the lane's capacity at 16 connections; {plan.seconds:g} s a point. "
        f"At each load alone and beside alternate {plan.repeats} times (the job paused with SIGSTOP and its lane drained, "
        "then resumed), so that each ratio compares runs seconds apart on a machine whose speed drifts; a cell is the "
        "mean of its runs. The job alone and the same job with the mechanism off (served side by side) take turns too. "
        "A bulk lane job's rows/s are the rows its lane answered meanwhile (the handler's HandlerBatchRows), not those it "
        "committed: a paused job's chunks in flight are answered while it is stopped and committed at once as it resumes.",
        "",
    ]
    for result in results:
        lines += [f"### {result.model}", "", f"Capacity: {result.capacity_rps:,.0f} req/s at 16 connections.", ""]
        lines += [
            "Each cell: p50 / p99 ms, req/s; alone (the runs between the bulk lane job's), then the machine's share the "
            "stream lane used (workers and frontend); beside, the ratios to the alone runs between its own and the job's "
            "rows/s meanwhile; [the share of the machine busy, whoever used it].",
            "",
            "| load | alone | beside bulk lane job | beside in-process job |",
            "| --- | --- | --- | --- |",
        ]
        for load in loads(plan):
            alone = result.point(load, "alone")
            cells = [
                f"{alone.p50_ms:.2f} / {alone.p99_ms:.2f}, {alone.rps:,.0f}; {alone.stream_cpu_share:.2f}{_errors(alone)} "
                f"[{alone.machine_busy:.2f}]"
            ]
            for condition in CONDITIONS[1:]:
                p, paired = result.point(load, condition), result.point(load, "alone", condition)
                ratios = f"x{p.p50_ms / paired.p50_ms:.2f} / x{p.p99_ms / paired.p99_ms:.2f}"
                cells.append(
                    f"{p.p50_ms:.2f} / {p.p99_ms:.2f}, {p.rps:,.0f}; {ratios}; job {p.job_rps:,.0f} rows/s{_errors(p)} "
                    f"[{p.machine_busy:.2f}]"
                )
            lines.append(f"| {load} | " + " | ".join(cells) + " |")
        errors = sum(p.errors for p in result.points)
        lines += [
            "",
            f"Job alone (no traffic): bulk lane {result.job_alone['bulk lane job']:,.0f} rows/s, in-process "
            f"{result.job_alone['in-process job']:,.0f} rows/s; the bulk lane job with the mechanism off "
            "(lanes interactive, no yield, OpenMP's default wait, the job at normal priority): "
            f"{result.baseline_rps:,.0f} rows/s. "
            f"Finished jobs checked (a short one per condition, to its end beside 4 connections): {result.jobs_checked}, "
            "every row exactly once"
            + (f"; failures: {'; '.join(result.jobs_failed)}" if result.jobs_failed else "")
            + f". Non-2xx answers on the stream lane: {errors}.",
            "",
            f"![{result.model} beside a batch job](bench/beside-{result.model}.png)",
            "",
            *waits_lines(result),
        ]
    lines += ["### Targets", "", "| target | ratio | bound | |", "| --- | --- | --- | --- |"]
    for result in results:
        for what, ratio, bound, met in targets(result, plan):
            sign = "≤" if " p50 " in what or " p99 " in what else "≥"
            lines.append(f"| {what} | {ratio:.2f} | {sign} {bound} | {'met' if met else 'missed'} |")
    return "\n".join(lines)


def waits_lines(result: ModelResult) -> list[str]:
    """The stream lane's waits for a core, alone and beside the bulk lane job, and those a background thread made; its
    workers' threads and its frontend's apart."""
    if result.waits_unavailable is not None:
        return [f"The stream lane's waits for a core: not measured ({result.waits_unavailable}).", ""]
    lines = [
        "The stream lane's waits for a core (`perf sched`, system wide, in the first alone and bulk lane job runs of "
        "each closed loop): each time a thread of its workers or of its frontend was put on a core, how long it had "
        "been runnable; apart, those where it took the core from a thread of the bulk lane's workers or the job's "
        "process (both at idle priority), having waited on that core (a thread moved in from another core is left "
        "out): an upper bound on how long the bulk side kept a core the stream lane wanted (other threads may have run "
        f"there for part of the wait). The bound, {HOLD_BOUND_MS:g} ms on the CPU, is checked on the longest of those.",
        "",
        "| load | threads | alone: p99 / max ms (n) | beside: p99 / max ms (n) | beside, the core from the bulk side: p50 "
        f"/ p99 / max ms (n) | longest ≤ {HOLD_BOUND_MS:g} ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (load, condition, group), beside in result.waits.items():
        if condition == "alone":
            continue
        alone = result.waits.get((load, "alone", group), core_waits.Waits())
        taken = beside.after_background_ms
        bound = ("met" if max(taken) <= HOLD_BOUND_MS else "missed") if taken else "none seen"
        moved = f"; {beside.moved_in} moved in from another core left out" if beside.moved_in else ""
        lines.append(
            f"| {load} | {group} | {_spread(alone.all_ms, False)} | {_spread(beside.all_ms, False)} "
            f"| {_spread(taken, True)}{moved} | {bound} |"
        )
    return [*lines, ""]


def _spread(values: list[float], median: bool) -> str:
    if not values:
        return "none (0)"
    shown = [percentile(values, 0.5)] if median else []
    shown += [percentile(values, 0.99), max(values)]
    return " / ".join(f"{v:.3f}" for v in shown) + f" ({len(values)})"


def holds_section(hold_results: list[HoldResult]) -> str:
    """The subsection "How long a bulk lane keeps the CPU", a region of its own (HOLDS_SECTION): `--holds-only` reruns
    it alone."""
    lines = [
        "### How long a bulk lane keeps the CPU",
        "",
        f"`python -m scripts.bench.beside` (or `--holds-only`), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{machine()}. Cooperative: the bulk core running full speed (2 passes at once) while two processes raise the "
        "signal at random (5-15 ms raised, 2-20 ms down, each); for each rise and each pass thread, what the thread "
        "ran from the rise to its next yield point, or to its first read of the signal after the batch ended if it "
        "never yielded to it (handlers/yielding.py: its run time since its last read of the signal before the rise, at "
        "most the wall clock since the rise; a thread waiting for a core or for the GIL holds none). A rise that ended "
        "before a thread read the signal is not counted. The issue's bound, 1 ms on the CPU, is checked on the longest "
        "hold near traffic; a rise during a full-size pass (no stream batch for a second before it) waits for that "
        "pass's end by design. OS: a normal-priority thread sleeping 1 ms at a time, how late it wakes, beside "
        "nothing, beside the same bulk core at normal priority and at SCHED_IDLE.",
        "",
        "| model | near traffic (a bounded pass or between operators): p50 / p99 / max ms (n) | longest ≤ 1 ms "
        "| at a full pass's end: p50 / p99 / max ms (n) "
        "| wake-up delay p99 / max ms: nothing, bulk at normal, bulk at idle |",
        "| --- | --- | --- | --- | --- |",
    ]
    for hold in hold_results:
        cells = [
            f"{percentile(h, 0.5):.3f} / {percentile(h, 0.99):.3f} / {max(h):.3f} ({len(h)})" if h else "none (0)"
            for h in (hold.bounded_ms, hold.after_full_ms)
        ]
        bound = ("met" if max(hold.bounded_ms) <= HOLD_BOUND_MS else "missed") if hold.bounded_ms else "none seen"
        wake = ", ".join(f"{percentile(v, 0.99):.3f} / {max(v):.3f}" for v in hold.wake_ms.values())
        lines.append(f"| {hold.model} | {cells[0]} | {bound} | {cells[1]} | {wake} |")
    return "\n".join(lines)


def _errors(point: Point) -> str:
    return f"; **{point.errors} non-2xx**" if point.errors else ""


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--quick", action="store_true", help="2 s a point, smaller jobs")
    known = sorted(registry.models())
    parser.add_argument("--models", nargs="+", default=known, choices=known)
    parser.add_argument("--no-report", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    parser.add_argument("--repeats", type=int, help=f"times alone and beside alternate at each load (default {Plan.repeats})")
    parser.add_argument("--holds-only", action="store_true", help='only "How long a bulk lane keeps the CPU"')
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error(f"--repeats must be at least 1, got {args.repeats}")
        plan = dataclasses.replace(plan, repeats=args.repeats)
    workdir = ROOT / "build" / "bench" / "beside"
    workdir.mkdir(parents=True, exist_ok=True)
    results = [] if args.holds_only else [bench_model(model, plan, workdir) for model in args.models]
    held = holds_section([holds(model, plan) for model in args.models])
    text = "" if args.holds_only else section(results, plan, args.quick)
    print(text + "\n\n" + held)
    if not args.no_report:
        for result in results:
            plot(result, plan)
        if not args.holds_only:
            replace_section(SECTION, text)
        replace_section(HOLDS_SECTION, held, after=(SECTION,))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
