"""`make bench` (stream half): single-request latency on the `digits` lane, one client vs many.

    python -m scripts.bench_stream [--requests 400] [--clients 1 8]

Serves model_store/digits.mar from a throwaway TorchServe (free ports) and sends single PNG requests
from N threads (keep-alive sessions). Reports latency percentiles, requests/s and how many requests
the handler saw per call (TorchServe's dynamic batching at work), then the same rows as one bulk
request for comparison. Written to its own section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from datetime import date

import numpy as np
import orjson
import requests

from scripts.bench_report import machine, replace_section
from scripts.client import predict
from scripts.endpoints import CONFIG, ROOT, Endpoints
from scripts.lane_settings import lane_settings
from scripts.temp_server import temporary_server
from models.digits.samples import grid_png, held_out


@dataclass(frozen=True)
class StreamResult:
    clients: int
    latencies_ms: list[float]
    seconds: float
    batch_sizes: list[int]
    correct: int

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q))

    @property
    def per_second(self) -> float:
        return len(self.latencies_ms) / self.seconds


def stream(endpoints: Endpoints, bodies: list[bytes], labels: list[int], clients: int) -> StreamResult:
    latencies: list[float] = []
    batch_sizes: list[int] = []
    correct = [0]
    lock = threading.Lock()
    next_index = iter(range(len(bodies)))

    def client() -> None:
        session = requests.Session()
        for index in iter(lambda: next(next_index, None), None):
            started = time.perf_counter()
            reply = predict(endpoints, "digits", bodies[index], "image/png", session=session, timeout=60)
            elapsed = (time.perf_counter() - started) * 1000
            if reply.status_code != 200:
                raise SystemExit(f"request {index}: HTTP {reply.status_code} {reply.text}")
            with lock:
                latencies.append(elapsed)
                batch_sizes.append(int(reply.headers["X-Batch-Requests"]))
                correct[0] += reply.json()["label"] == labels[index]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return StreamResult(clients, latencies, time.perf_counter() - started, batch_sizes, correct[0])


def bulk_rows_per_second(endpoints: Endpoints, grids: np.ndarray) -> float:
    body = orjson.dumps({"instances": [g.tolist() for g in grids]})
    predict(endpoints, "digits-bulk", body, "application/json")  # warm-up
    started = time.perf_counter()
    reply = predict(endpoints, "digits-bulk", body, "application/json")
    seconds = time.perf_counter() - started
    if reply.status_code != 200 or len(reply.json()["predictions"]) != len(grids):
        raise SystemExit(f"bulk request failed: HTTP {reply.status_code}")
    return len(grids) / seconds


def report(results: list[StreamResult], bulk: float, requests_sent: int) -> str:
    lane = lane_settings(CONFIG, "digits")["digits"]
    lines = [
        "## Stream lane: single-request latency (`make bench`)",
        "",
        f"Measured {date.today().isoformat()} on {machine()}. {requests_sent} single PNG requests of held-out digits",
        f"per row below, to the `digits` lane (batchSize {lane.batch_size}, maxBatchDelay {lane.max_batch_delay} ms), keep-alive connections.",
        "",
        "| clients | p50 ms | p95 ms | p99 ms | requests/s | mean requests per handler call | correct |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.clients} | {r.percentile(50):.1f} | {r.percentile(95):.1f} | {r.percentile(99):.1f} | {r.per_second:,.0f} "
            f"| {statistics.mean(r.batch_sizes):.1f} | {r.correct}/{len(r.latencies_ms)} |"
        )
    best = max(results, key=lambda r: r.per_second)
    lines += [
        "",
        f"The same {requests_sent} rows as one request to `digits-bulk`: {bulk:,.0f} rows/s, "
        f"{bulk / best.per_second:.1f}x the best stream rate ({best.clients} clients): per-request overhead, not the model, "
        "bounds the stream lane.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args(argv)
    grids, labels = held_out()
    grids, labels = np.resize(grids, (args.requests, 8, 8)), np.resize(labels, args.requests).tolist()
    bodies = [grid_png(g) for g in grids]
    with temporary_server(ROOT / "model_store" / "digits.mar") as server:
        endpoints = server.endpoints
        stream(endpoints, bodies[:20], labels[:20], 1)  # warm-up
        results = [stream(endpoints, bodies, labels, clients) for clients in args.clients]
        bulk = bulk_rows_per_second(endpoints, grids)
    text = report(results, bulk, args.requests)
    print(text)
    if not args.no_report:
        replace_section("stream bench", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
