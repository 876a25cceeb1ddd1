"""`make bench` (stream half): single-request latency on the `digits` lane, one client vs many.

    python -m scripts.checks.bench_stream [--requests 400] [--clients 1 8]

Serves model_store/digits.mar from a throwaway TorchServe (free ports) and sends single PNG requests
from N threads (keep-alive sessions). Reports latency percentiles, requests/s and how many requests
the handler saw per call (TorchServe's dynamic batching at work), then the same rows as one bulk
request for comparison. Written to its own section of docs/benchmarks.md.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import date

import numpy as np
import orjson

from models.digits.samples import grid_png, held_out
from scripts import cli
from scripts.checks.report import machine, replace_section
from scripts.clients.load import send_concurrently
from scripts.clients.rest import predict
from scripts.errors import ScriptError
from scripts.layout import JSON, MODEL_STORE
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints
from scripts.server.temporary import temporary_server


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
    started = time.perf_counter()
    answers = send_concurrently(endpoints, "digits", bodies, ["image/png"] * len(bodies), clients)
    seconds = time.perf_counter() - started
    for index, answer in enumerate(answers):
        if answer.reply.status_code != 200:
            raise ScriptError(f"request {index}: HTTP {answer.reply.status_code} {answer.reply.text}")
    correct = sum(answer.reply.json()["label"] == label for answer, label in zip(answers, labels, strict=True))
    return StreamResult(clients, [a.latency_ms for a in answers], seconds, [a.batch_requests for a in answers], correct)


def bulk_rows_per_second(endpoints: Endpoints, grids: np.ndarray) -> float:
    body = orjson.dumps({"instances": [g.tolist() for g in grids]})
    predict(endpoints, "digits-bulk", body, JSON)  # warm-up
    started = time.perf_counter()
    reply = predict(endpoints, "digits-bulk", body, JSON)
    seconds = time.perf_counter() - started
    if reply.status_code != 200 or len(reply.json()["predictions"]) != len(grids):
        raise ScriptError(f"bulk request failed: HTTP {reply.status_code}")
    return len(grids) / seconds


def report(results: list[StreamResult], bulk: float, requests_sent: int) -> str:
    lane = ServerConfig.read().lane_settings("digits")["digits"]
    lines = [
        "## Stream lane: single-request latency (`make bench`)",
        "",
        f"Measured {date.today().isoformat()} on {machine()}. {requests_sent} single PNG requests of held-out digits",
        f"per row below, to the `digits` lane "
        f"(batchSize {lane.batch_size}, maxBatchDelay {lane.max_batch_delay} ms), keep-alive connections.",
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
    parser = cli.parser_for(__doc__)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args(argv)
    grids, labels = held_out()
    grids, labels = np.resize(grids, (args.requests, 8, 8)), np.resize(labels, args.requests).tolist()
    bodies = [grid_png(g) for g in grids]
    with temporary_server(MODEL_STORE / "digits.mar") as server:
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
    cli.run(lambda: main())
