"""Where a lone request's milliseconds go, from one closed loop at one connection against a running TorchServe.

    python -m scripts.bench.lone [--seconds 6]     # digits lane and the no-op floor, this checkout's code

At one connection every TorchServe batch holds one request, so per-batch figures are per-request figures:
  - client and Netty: wrk's mean latency minus TorchServe's own clock of the request
    (ts_inference_latency_microseconds: from the request's arrival in the frontend to its answer);
  - batch wait: TorchServe's queue time (ts_queue_latency_microseconds), maxBatchDelay for a lone request;
  - worker round trip outside handle(): the rest of TorchServe's clock minus the handler's (HandlerLatencySeconds):
    the frontend-worker socket, TorchServe's Python protocol, the metric lines (emitted after the handler's clock);
  - decode, collate, forward, encode: the handler's stage timers (Handler*Seconds).
Besides, each process's CPU per request (frontend JVM, workers) from /proc, and the bytes the server's log files
grew by per request. docs/benchmarks.md ("Where a lone request's milliseconds go") gives the method and figures.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import requests

from scripts.bench import loadgen
from scripts.server.process import Server

_SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(server: Server) -> dict[tuple[str, str], float]:
    """(series, lane) -> value from the metrics port, summed over other labels; histograms' _sum and _count only."""
    text = requests.get(f"{server.endpoints.metrics}/metrics", timeout=10).text
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1).endswith("_bucket"):
            continue
        labels = dict(_LABEL.findall(match.group(2)))
        key = (match.group(1), labels.get("lane") or labels.get("model_name") or "")
        values[key] = values.get(key, 0.0) + float(match.group(3))
    return values


def log_bytes(workdir: Path) -> int:
    """Bytes of every file under the server's logs/ folder and its stdout file (torchserve.out)."""
    files = [path for path in (workdir / "logs").rglob("*") if path.is_file()]
    files += [path for path in (workdir / "torchserve.out",) if path.exists()]
    return sum(path.stat().st_size for path in files)


@dataclass(frozen=True)
class LoneRequest:
    """Means per request at one connection, in ms."""

    lane: str
    requests: int
    p50_ms: float
    total_ms: float
    client_and_netty_ms: float
    batch_wait_ms: float
    worker_round_trip_ms: float
    decode_ms: float
    collate_ms: float
    forward_ms: float
    encode_ms: float
    frontend_cpu_ms: float
    workers_cpu_ms: float
    log_bytes_per_request: float

    def row(self) -> dict:
        return asdict(self)


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _frontend_pid(server: Server) -> int:
    root = psutil.Process(server.process.pid)
    java = [child.pid for child in root.children(recursive=True) if "java" in child.name()]
    return java[0] if java else root.pid


def _worker_pids(server: Server, lane: str) -> list[int]:
    endpoints = server.endpoints
    reply = requests.get(f"{endpoints.management}/models/{lane}", headers=endpoints.auth("management"), timeout=10)
    return [int(worker["pid"]) for version in reply.json() for worker in version.get("workers", []) if worker.get("pid")]


def lone_request(server: Server, lane: str, target: loadgen.Target, seconds: float) -> LoneRequest:
    """One connection for `seconds` on `lane`, split as the module says."""
    frontend, workers = _frontend_pid(server), _worker_pids(server, lane)
    before, logs = scrape(server), log_bytes(server.workdir)
    cpu_frontend, cpu_workers = _cpu_seconds([frontend]), _cpu_seconds(workers)
    run = loadgen.closed_loop(target, 1, seconds)
    after = scrape(server)
    cpu_frontend, cpu_workers = _cpu_seconds([frontend]) - cpu_frontend, _cpu_seconds(workers) - cpu_workers
    grown = log_bytes(server.workdir) - logs
    count = max(run.requests, 1)

    def per_request_ms(series: str, scale: float) -> float:
        return (after.get((series, lane), 0.0) - before.get((series, lane), 0.0)) / count * scale

    def handler_ms(stage: str) -> float:
        batches = after.get((f"Handler{stage}Seconds_count", lane), 0.0) - before.get((f"Handler{stage}Seconds_count", lane), 0.0)
        total = after.get((f"Handler{stage}Seconds_sum", lane), 0.0) - before.get((f"Handler{stage}Seconds_sum", lane), 0.0)
        return total / batches * 1000 if batches else 0.0

    inference = per_request_ms("ts_inference_latency_microseconds", 1e-3)
    queue = per_request_ms("ts_queue_latency_microseconds", 1e-3)
    mean = run.extra.get("mean_ms", run.p50_ms)
    return LoneRequest(
        lane=lane,
        requests=run.requests,
        p50_ms=run.p50_ms,
        total_ms=mean,
        client_and_netty_ms=mean - inference,
        batch_wait_ms=queue,
        worker_round_trip_ms=inference - queue - handler_ms("Latency"),
        decode_ms=handler_ms("Decode"),
        collate_ms=handler_ms("Collate"),
        forward_ms=handler_ms("Forward"),
        encode_ms=handler_ms("Encode"),
        frontend_cpu_ms=cpu_frontend / count * 1000,
        workers_cpu_ms=cpu_workers / count * 1000,
        log_bytes_per_request=grown / count,
    )


ROWS = (
    ("client, Netty and the answer's way back (wrk mean - TorchServe's clock)", "client_and_netty_ms"),
    ("batch wait (TorchServe's queue time: maxBatchDelay for a lone request)", "batch_wait_ms"),
    ("worker round trip outside handle(): socket, TorchServe's Python protocol, metric lines", "worker_round_trip_ms"),
    ("decode (JSON body to rows)", "decode_ms"),
    ("collate (rows to a tensor)", "collate_ms"),
    ("forward (the model program, outputs back)", "forward_ms"),
    ("encode (results to JSON)", "encode_ms"),
    ("**total: mean latency** (p50)", "total_ms"),
    ("frontend JVM CPU per request", "frontend_cpu_ms"),
    ("workers' CPU per request", "workers_cpu_ms"),
    ("bytes written to logs per request", "log_bytes_per_request"),
)


def table(columns: dict[str, dict]) -> list[str]:
    """Markdown rows: one column per measured case ({title: LoneRequest.row()})."""
    lines = ["| where (means per request, ms) | " + " | ".join(columns) + " |", "| --- |" + " ---: |" * len(columns)]
    for title, key in ROWS:
        cells = []
        for row in columns.values():
            value = row[key]
            cell = f"{value:,.0f}" if key == "log_bytes_per_request" else f"{value:.2f}"
            if key == "total_ms":
                cell = f"**{cell}** ({row['p50_ms']:.2f})"
            cells.append(cell)
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines
