"""Soak: stream traffic on every model and batch jobs at once for N minutes; fails on memory or fd growth.

    python -m scripts.hardening.soak --minutes 10            # its own TorchServe on free ports (make soak)
    python -m scripts.hardening.soak --minutes 1 --running   # `make serve`'s server (config.properties)

wrk keeps a few connections busy on every model's stream lane (its first samples in one request, so a batch holds
rows of different shapes) through scripts/bench/loadgen.py, while batch jobs (scripts/jobs/batch_job.py) of its
samples run through every bulk lane at once, one after another on each; each model's model.yaml says how many of
each (soak:).
Every worker (pids from the management API) and the
frontend (the workers' parent, the JVM) is sampled with psutil after a warm-up (full batches on the stream
lanes, then the same traffic) and after the run, both times with no request in flight: resident memory
(RSS) and open file descriptors. It fails when a process grows past BOUNDS, a worker restarts, a stream
request fails or a batch job misses a row. Its own server runs with the access log on and small log files
(LOG_FLAGS), so the logs roll over many times during a soak: it also fails when the server's logs/ folder ends
larger than the rotation's cap. Writes build/soak.json.
"""

from __future__ import annotations

import dataclasses
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson
import psutil

from handlers.host_memory import HostMemory
from handlers.settings import HandlerSettings
from models import registry
from scripts import cli
from scripts.bench import loadgen
from scripts.clients.load import send_concurrently
from scripts.errors import ScriptError
from scripts.hardening import subject
from scripts.jobs.batch_job import JobConfig, run_job
from scripts.jobs.example import write_example
from scripts.layout import BUILD, JSON
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints
from scripts.swap.management import ManagementApi

MIB = 1024 * 1024
# Samples per stream request, at most (fewer where the lane's row or byte limit says so): rows of different shapes
# in one batch (texts of different lengths pad differently, photographs of different sizes resize differently).
STREAM_ROWS = 4
# wrk's connections per stream lane come from model.yaml (soak.connections): a closed loop, each connection sending
# its next request when the last is answered, follows the machine's speed, so a slow or shared machine gets fewer
# requests, never a queue of timeouts; and no batch grows past what the warm-up's burst already gave the workers.
# Batch jobs (soak.job_rows) are small enough to finish within seconds of the run's end.
SOAK_MODELS = tuple(registry.models())  # the models the soak drives (and its own server loads): every folder
SAMPLE_EVERY_S = 10.0
# The soak's own server logs every request (the access log on) into files of 1 MB with 2 old ones each: the
# five log files of monitoring/log4j2.xml then hold at most 5 x 3 MB, however long the soak.
LOG_FLAGS = "-Daccess_log=all -Dlog_file_size=1MB -Dlog_files=2"
LOGS_CAP_BYTES = 5 * 3 * MIB


@dataclass(frozen=True)
class Bound:
    """How much a process may grow between the two samples: RSS by the larger of `rss_mib` and
    `rss_percent` of where it started, open file descriptors by `fds`."""

    rss_mib: float
    rss_percent: float
    fds: int

    def allowed_rss_mib(self, start_mib: float) -> float:
        return max(self.rss_mib, start_mib * self.rss_percent / 100)


# Why these numbers: docs/hardening.md "Soak". A worker holds the same model and serves the same shapes at
# both samples, so after the warm-up its RSS should stay flat (allocator caches already grown); the bound
# leaves room for glibc arenas and torch's CPU allocator caching a few odd shapes, and is far below what
# a per-request leak of even 1 KiB makes over the run. A worker may also hold its lane's heap slack above what
# its last trim left (handler.heap_slack_mib, handlers/host_memory.py): at a sample it may be anywhere in it,
# so a lane with more slack than the bound gets its slack plus SLACK_MARGIN_MIB (bound_for). The frontend is a
# JVM: its heap grows and shrinks with garbage collection, so its bound is wider. A descriptor is either leaked
# or not: workers may not gain one; the frontend may gain a few (Netty's event loops open pipes/epoll descriptors lazily).
BOUNDS = {"worker": Bound(rss_mib=48, rss_percent=10, fds=0), "frontend": Bound(rss_mib=192, rss_percent=40, fds=16)}
SLACK_MARGIN_MIB = 16


class SoakError(ScriptError):
    """The soak could not run (no lanes, no workers, the load generator failed)."""


@dataclass(frozen=True)
class Lane(subject.Subject):
    """A lane to load: its server and the model whose traffic it takes. Lanes named `<model>-bulk` get
    batch jobs, the others stream requests."""

    model: str  # the model's folder name (models/<model>/)


@dataclass(frozen=True)
class Sample:
    role: str  # "frontend" or the worker's lane
    pid: int
    rss_mib: float
    fds: int


@dataclass
class ProcessReport:
    role: str
    pid: int
    start: Sample
    end: Sample | None
    peak_rss_mib: float
    bound: Bound

    @property
    def kind(self) -> str:
        return "frontend" if self.role == "frontend" else "worker"

    @property
    def rss_growth_mib(self) -> float:
        return self.end.rss_mib - self.start.rss_mib if self.end else 0.0

    @property
    def fd_growth(self) -> int:
        return self.end.fds - self.start.fds if self.end else 0

    def problems(self) -> list[str]:
        name = f"{self.role} (pid {self.pid})"
        if self.end is None:
            return [f"{name} is gone: it exited or was restarted during the soak"]
        found = []
        allowed = self.bound.allowed_rss_mib(self.start.rss_mib)
        if self.rss_growth_mib > allowed:
            found.append(
                f"{name}: RSS grew {self.rss_growth_mib:+.1f} MiB ({self.start.rss_mib:.0f} -> "
                f"{self.end.rss_mib:.0f}), bound {allowed:.0f} MiB"
            )
        if self.fd_growth > self.bound.fds:
            found.append(f"{name}: open fds {self.start.fds} -> {self.end.fds}, bound +{self.bound.fds}")
        return found


@dataclass
class Traffic:
    """What the soak sent: stream results per lane (wrk) and batch jobs per model."""

    stream: dict[str, loadgen.LoadResult] = field(default_factory=dict)
    jobs: list[dict] = field(default_factory=list)  # {"model", "rows", "predicted", "failed", "seconds"}

    def problems(self) -> list[str]:
        found = [f"{lane}: {r.errors} of {r.requests} stream requests failed" for lane, r in self.stream.items() if r.errors]
        found += [f"{lane}: no stream request answered" for lane, r in self.stream.items() if r.requests == 0]
        found += [
            f"{job['model']} batch job: {job['predicted']} of {job['rows']} rows predicted, {job['failed']} rejected"
            for job in self.jobs
            if job["predicted"] != job["rows"] or job["failed"]
        ]
        if not self.jobs:
            found.append("no batch job finished during the soak")
        return found


@dataclass
class SoakReport:
    minutes: float
    warmup_s: float
    processes: list[ProcessReport]
    traffic: Traffic
    restarted: list[str]  # lanes whose worker pids changed
    logs_bytes: tuple[int, int] = (0, 0)  # the server's logs/ folder at the first and the last sample
    logs_cap_bytes: int | None = None  # None: the server's own settings (--running), not checked

    @property
    def failures(self) -> list[str]:
        found = [problem for process in self.processes for problem in process.problems()]
        if self.logs_cap_bytes is not None and self.logs_bytes[1] > self.logs_cap_bytes:
            found.append(
                f"logs/ holds {self.logs_bytes[1] / MIB:.1f} MiB, past the rotation's cap {self.logs_cap_bytes / MIB:.0f} MiB"
            )
        found += [f"{lane}: a worker was restarted during the soak" for lane in self.restarted]
        return found + self.traffic.problems()

    def table(self) -> str:
        width = max([12, *(len(p.role) for p in self.processes)])
        lines = [
            f"{'process':{width}} {'pid':>7}  {'RSS start':>9} {'end':>7} {'growth':>7} {'bound':>6} {'peak':>7}  "
            f"{'fds start':>9} {'end':>4} {'bound':>5}  verdict",
        ]
        for p in self.processes:
            end_rss, end_fds = (f"{p.end.rss_mib:7.1f}", f"{p.end.fds:4d}") if p.end else ("      -", "   -")
            verdict = "ok" if not p.problems() else "FAIL"
            lines.append(
                f"{p.role:{width}} {p.pid:7d}  {p.start.rss_mib:9.1f} {end_rss} {p.rss_growth_mib:+7.1f} "
                f"{p.bound.allowed_rss_mib(p.start.rss_mib):6.0f} {p.peak_rss_mib:7.1f}  {p.start.fds:9d} {end_fds} "
                f"{'+' + str(p.bound.fds):>5}  {verdict}"
            )
        lines.append("(RSS in MiB; start after the warm-up, end after the run, both with no request in flight)")
        return "\n".join(lines)

    def text(self) -> str:
        lines = [f"soak: {self.minutes:g} min after a {self.warmup_s:.0f} s warm-up", self.table()]
        for lane, result in self.traffic.stream.items():
            lines.append(f"stream {lane:7}: {result.row()}")
        for model in sorted({job["model"] for job in self.traffic.jobs}):
            jobs = [job for job in self.traffic.jobs if job["model"] == model]
            rows = sum(job["rows"] for job in jobs)
            lines.append(f"batch  {model:7}: {len(jobs)} jobs through {model}-bulk, {rows} rows")
        cap = f", cap {self.logs_cap_bytes / MIB:.0f} MiB" if self.logs_cap_bytes is not None else ""
        lines.append(f"logs/   : {self.logs_bytes[0] / MIB:.1f} -> {self.logs_bytes[1] / MIB:.1f} MiB{cap}")
        failures = self.failures
        lines.append("PASS" if not failures else "FAIL:")
        lines += [f"  - {failure}" for failure in failures]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "minutes": self.minutes,
            "warmup_s": self.warmup_s,
            "bounds": {kind: asdict(bound) for kind, bound in BOUNDS.items()},
            "logs_bytes": {"start": self.logs_bytes[0], "end": self.logs_bytes[1], "cap": self.logs_cap_bytes},
            "processes": [
                {
                    "role": p.role,
                    "pid": p.pid,
                    "rss_mib_start": round(p.start.rss_mib, 1),
                    "rss_mib_end": round(p.end.rss_mib, 1) if p.end else None,
                    "rss_mib_peak": round(p.peak_rss_mib, 1),
                    "fds_start": p.start.fds,
                    "fds_end": p.end.fds if p.end else None,
                }
                for p in self.processes
            ],
            "stream": {lane: asdict(result) for lane, result in self.traffic.stream.items()},
            "jobs": self.traffic.jobs,
            "failures": self.failures,
        }


# --- the processes -------------------------------------------------------------------------------------------


def worker_pids(lanes: dict[str, Lane]) -> dict[int, str]:
    """Every worker of every lane, from the management API: {pid: lane}."""
    pids = {}
    for name, lane in lanes.items():
        pids.update({pid: name for pid in ManagementApi(lane.endpoints).worker_pids(name)})
    if not pids:
        raise SoakError(f"the management API names no worker pid for lanes {sorted(lanes)}")
    return pids


def processes(lanes: dict[str, Lane]) -> dict[int, str]:
    """The workers and their frontend(s): TorchServe's frontend starts every worker, so it is their parent."""
    found = worker_pids(lanes)
    for pid in list(found):
        try:
            parent = psutil.Process(pid).parent()
        except psutil.NoSuchProcess:
            continue
        if parent is not None:
            found.setdefault(parent.pid, "frontend")
    return found


def sample(pids: dict[int, str]) -> dict[int, Sample]:
    samples = {}
    for pid, role in pids.items():
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                samples[pid] = Sample(role, pid, process.memory_info().rss / MIB, process.num_fds())
        except psutil.NoSuchProcess:
            continue
    return samples


# --- the traffic ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """The stream targets and their connections (one per stream lane) and the batch-job inputs (one per bulk lane)."""

    stream: dict[str, tuple[loadgen.Target, int]]
    jobs: dict[str, tuple[Lane, Path]]  # bulk lane -> (lane, input file)
    lanes: dict[str, Lane]


def workload(lanes: dict[str, Lane], folder: Path) -> Workload:
    stream, jobs = {}, {}
    for name, lane in lanes.items():
        if name.endswith("-bulk"):
            jobs[name] = (lane, _job_input(lane.model, folder))
            continue
        endpoints = lane.endpoints
        target = loadgen.Target(endpoints.prediction_url(name), stream_body(name), JSON, endpoints.token("inference"))
        stream[name] = (target, registry.model(lane.model).soak["connections"])
    return Workload(stream, jobs, lanes)


def stream_body(lane: str) -> bytes:
    """The stream request: the model's first STREAM_ROWS samples, as many as the lane's row and byte limits take."""
    found, _ = registry.lane(lane)
    instances = list(found.samples().instances)
    rows = min(STREAM_ROWS, len(instances), found.handler_value("max_request_rows", lane) or STREAM_ROWS)
    limit = found.handler_value("max_request_bytes", lane)
    while True:
        body = orjson.dumps({"instances": instances[:rows]})
        if rows == 1 or limit is None or len(body) <= limit:
            return body
        rows -= 1


def _job_input(model: str, folder: Path) -> Path:
    """soak.job_rows rows cycled from the model's samples, as JSONL."""
    return write_example(model, registry.model(model).soak["job_rows"], folder / f"{model}.jsonl")


def burst(work: Workload, folder: Path) -> None:
    """The largest work each lane can get, once: on every stream lane as many requests at once as its
    workers can batch (batchSize x workers), and one batch job on every bulk lane. After this the workers'
    allocators already hold what the biggest batch needs, so that is in the first sample, not growth."""
    for name, (target, _) in work.stream.items():
        lane = work.lanes[name]
        settings = ServerConfig.read(lane.config).lane_settings(lane.model)[name]
        clients = settings.batch_size * settings.workers
        answers = send_concurrently(lane.endpoints, name, [target.body] * clients, [target.content_type] * clients, clients)
        failed = [answer.reply.status_code for answer in answers if answer.reply.status_code != 200]
        if failed:
            raise SoakError(f"{name}: {len(failed)} of {len(answers)} warm-up requests failed (HTTP {sorted(set(failed))})")
    for name, (lane, source) in work.jobs.items():
        _job(name, lane, source, folder)


def run_traffic(work: Workload, seconds: float, folder: Path, on_tick=None) -> Traffic:
    """wrk on every stream lane for `seconds` while batch jobs run on every bulk lane at once, one after another on
    each (a lane starved by the stream traffic slows its own jobs, not the others'); `on_tick` is called every
    SAMPLE_EVERY_S meanwhile (the sampler)."""
    traffic = Traffic()
    done = threading.Event()
    with ThreadPoolExecutor(max_workers=len(work.stream) + len(work.jobs), thread_name_prefix="soak") as pool:
        streams = {
            lane: pool.submit(loadgen.closed_loop, target, connections, seconds)
            for lane, (target, connections) in work.stream.items()
        }
        deadline = time.monotonic() + seconds
        lanes = [pool.submit(_jobs_until, name, job, deadline, folder, done) for name, job in work.jobs.items()]
        try:
            while not all(future.done() for future in streams.values()):
                if on_tick:
                    on_tick()
                done.wait(min(SAMPLE_EVERY_S, seconds))
        finally:
            done.set()
        traffic.stream = {lane: future.result() for lane, future in streams.items()}
        traffic.jobs = [job for future in lanes for job in future.result()]
    return traffic


def _jobs_until(name: str, job: tuple[Lane, Path], deadline: float, folder: Path, stop: threading.Event) -> list[dict]:
    """Batch jobs through bulk lane `name`, one after another, the first at once and each next one until the
    deadline: each one's rows, predictions and rejections."""
    lane, source = job
    results = [_job(name, lane, source, folder)]
    while time.monotonic() < deadline and not stop.is_set():
        results.append(_job(name, lane, source, folder))
    return results


def _job(name: str, lane: Lane, source: Path, folder: Path) -> dict:
    """One batch job through bulk lane `name`: its rows, predictions and rejections."""
    config = JobConfig(
        model=lane.model,
        input=source,
        output=folder / f"{name}.predictions.jsonl",
        lane=name,
        overwrite=True,
        config=lane.config,
        key_file=lane.endpoints.key_file,
        progress_bar=False,
    )
    summary = run_job(config)
    return {
        "model": lane.model,
        "rows": summary.total,
        "predicted": summary.predicted,
        "failed": summary.failed,
        "seconds": round(summary.seconds, 2),
    }


# --- the soak ------------------------------------------------------------------------------------------------


def soak(lanes: dict[str, Lane], minutes: float, warmup_s: float, logs: Path, settle_s: float = 2.0) -> SoakReport:
    """Warm up, sample, run `minutes` of traffic (sampling the peak), settle, sample again (`logs`: its size)."""
    with tempfile.TemporaryDirectory(prefix="soak-") as folder:
        work = workload(lanes, Path(folder))
        burst(work, Path(folder))
        run_traffic(work, warmup_s, Path(folder))
        time.sleep(settle_s)
        pids = processes(lanes)
        start, logs_start = sample(pids), folder_bytes(logs)
        peaks = {pid: s.rss_mib for pid, s in start.items()}

        def tick() -> None:
            for pid, now in sample(pids).items():
                peaks[pid] = max(peaks[pid], now.rss_mib)

        traffic = run_traffic(work, minutes * 60, Path(folder), on_tick=tick)
        time.sleep(settle_s)
        end, logs_end = sample(pids), folder_bytes(logs)
        after = processes(lanes)
    reports = [
        ProcessReport(s.role, pid, s, end.get(pid), max(peaks[pid], end[pid].rss_mib if pid in end else 0), bound_for(s.role))
        for pid, s in sorted(start.items(), key=lambda item: (item[1].role != "frontend", item[1].role, item[0]))
    ]
    restarted = sorted({role for pid, role in after.items() if pid not in pids and role != "frontend"})
    return SoakReport(minutes, warmup_s, reports, traffic, restarted, (logs_start, logs_end))


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else 0


def bound_for(role: str) -> Bound:
    """The frontend's bound, or a worker's of lane `role`: BOUNDS', or its lane's heap slack plus a margin where that
    is more."""
    if role == "frontend":
        return BOUNDS["frontend"]
    bound = BOUNDS["worker"]
    found, _ = registry.lane(role)
    settings = HandlerSettings.from_yaml(found.handler_config(), role)
    slack_mib = HostMemory(None, settings.mmap_threshold_bytes(role), settings.heap_slack_bytes(role)).slack / MIB
    return dataclasses.replace(bound, rss_mib=max(bound.rss_mib, slack_mib + SLACK_MARGIN_MIB))


def default_warmup(minutes: float) -> float:
    """A tenth of the run, at least 5 s and at most 30 s: enough for every batch shape to have been seen."""
    return min(30.0, max(5.0, minutes * 6))


def lanes_of(config: Path, key_file: Path, models: tuple[str, ...] = SOAK_MODELS) -> dict[str, Lane]:
    """The stream and bulk lanes of `models` on the server of `config`. TorchServe writes key_file.json and logs/
    into the folder it was started from, so the logs are found beside the key file."""
    endpoints = Endpoints.from_config(config, key_file)
    logs = key_file.parent / "logs"
    return {lane: Lane(config, endpoints, logs, model) for model in models for lane in (model, f"{model}-bulk")}


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the measured run (default %(default)s)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up before the first sample (default: a tenth, 5..30 s)")
    subject.add_options(parser, BUILD / "soak.json")
    args = parser.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else default_warmup(args.minutes)
    logging = {"vmargs": f"{ServerConfig.read().vmargs} {LOG_FLAGS}"}
    with subject.subject(args, logging, SOAK_MODELS) as server:
        report = soak(lanes_of(server.config, server.endpoints.key_file), args.minutes, warmup, server.logs)
    if not args.running:
        report.logs_cap_bytes = LOGS_CAP_BYTES
    return subject.finish(report, args.report)


if __name__ == "__main__":
    cli.run(lambda: main())
