"""Warm a lane before it takes traffic: `make serve`'s readiness, the pod's (scripts/container/entrypoint.py) and
hot-swap's (a new version before it becomes the default; scripts/swap/hot_swap.py).

A fresh server is slow at first (docs/benchmarks.md, "Warm-up"): the JVM interprets the frontend's request path
until its JIT has compiled it, which takes some 50,000 requests (the first ~8 s at 64 connections here), and each
worker's first calls into its model are slower than later ones. So, before a client comes:
  - the JIT: a wrk burst (64 keep-alive connections, one-row requests) on one stream lane for `burst_seconds`;
    every lane shares the frontend's request path, so one lane pays it for all. wrk is a system package of the
    test layer (system-packages.sh) and of the serving image; where it is missing the burst is skipped and said so
    (Python clients reach a few thousand requests in the same time, far too few: measured in docs/benchmarks.md);
  - the workers' first calls: concurrent one-row requests from Python to every stream lane for a few seconds,
    and a few requests to every bulk lane.
A new version registered beside a warm one (hot-swap) needs only its workers warmed: `warm_version` sends the
lane's own requests to /predictions/<lane>/<version> in windows of a second until two windows in a row run at
the same rate (within `tolerance`) or `max_seconds` pass.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson
import requests

from models import registry
from scripts.layout import JSON
from scripts.server.config import BULK_SUFFIX
from scripts.server.endpoints import Endpoints, token_refused
from scripts.server.front_door import BULK_CLIENT_CHUNKS
from scripts.wrk.driver import Target, closed_loop

BULK_ROWS = 256  # a bulk lane's request: a chunk of rows (the batch jobs send thousands; a small chunk keeps the
# warm-up's windows of a second countable)
STREAM_CONNECTIONS, BULK_CONNECTIONS = 16, 2  # warm_version's load: a new version shares the cores with the old


@dataclass(frozen=True)
class WarmUp:
    lane: str
    requests: int
    failed: int
    seconds: float
    version: str | None = None  # warm_version: the version warmed
    rates: tuple[float, ...] = ()  # warm_version: req/s of each window
    steady: bool = False  # warm_version: the last two windows ran within the tolerance

    def summary(self) -> str:
        rates = " -> ".join(f"{rate:,.0f}" for rate in self.rates)
        verdict = "steady" if self.steady else "not steady, time is up"
        where = self.lane + (f" {self.version}" if self.version else "")
        done = f"{self.requests:,} requests in {self.seconds:.1f}s ({rates} req/s, {verdict})"
        return f"warm-up of {where}: {done}, {self.failed} failed"


def sample_body(lane: str) -> bytes:
    """One request of the lane's kind from its model's samples (models/<name>/samples.json): one instance, and a
    chunk of them for a bulk lane."""
    found, _ = registry.lane(lane)
    return orjson.dumps({"instances": found.samples().request(bulk_rows(found, lane) if lane.endswith(BULK_SUFFIX) else 1)})


def bulk_rows(found: registry.Model, lane: str) -> int:
    """A bulk warm-up chunk: BULK_ROWS, or four of the lane's passes where those are smaller (images: 4 x 4 rows)."""
    return min(BULK_ROWS, 4 * int(found.handler_value("max_batch_rows", lane) or BULK_ROWS))


def stream_body(lane: str) -> bytes:
    """One interactive (one-row) request for the lane's model, whatever kind of lane it is."""
    return sample_body(lane.removesuffix(BULK_SUFFIX))


def warm_lane(
    endpoints: Endpoints, lane: str, seconds: float, concurrency: int = 8, version: str | None = None, body: bytes | None = None
) -> WarmUp:
    """`concurrency` keep-alive clients sending `body` (one row by default) to `lane` (`version`) for `seconds`."""
    url, body = endpoints.prediction_url(lane, version), body or stream_body(lane)
    headers = {"Content-Type": JSON, **endpoints.auth("inference")}
    deadline = time.monotonic() + seconds

    def client() -> tuple[int, int]:
        sent = failed = 0
        mine = headers
        with requests.Session() as session:
            while time.monotonic() < deadline:
                reply = session.post(url, data=body, headers=mine, timeout=60)
                if token_refused(reply):  # the key expired meanwhile: renewed, as every client here does
                    mine = {**mine, **endpoints.auth("inference")}
                    reply = session.post(url, data=body, headers=mine, timeout=60)
                sent, failed = sent + 1, failed + (reply.status_code != 200)
        return sent, failed

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda _: client(), range(concurrency)))
    return WarmUp(lane, sum(r[0] for r in results), sum(r[1] for r in results), time.monotonic() - started, version)


def burst(
    endpoints: Endpoints, lane: str, seconds: float, connections: int = 64, version: str | None = None, body: bytes | None = None
) -> WarmUp | None:
    """wrk on `lane` (`version`) for `seconds` at `connections`; None where wrk is not installed."""
    if shutil.which("wrk") is None or seconds <= 0:
        return None
    url = endpoints.prediction_url(lane, version)
    # wrk sends one token for the whole run: one that outlives it (keys that expire every 30 s, as in the image
    # test, would otherwise refuse the rest of the burst).
    target = Target(url, body or stream_body(lane), JSON, endpoints.token("inference", lasting_s=seconds + 5))
    started = time.monotonic()
    run = closed_loop(target, connections, seconds, timeout_s=30)
    return WarmUp(lane, run.requests, run.errors, time.monotonic() - started, version, (run.rps,))


def burst_lane(lanes: list[str]) -> str | None:
    """The stream lane the JIT burst goes to: the one that merges the most requests at once (workers x batch size,
    models/<name>/model.yaml), the cheapest per request."""
    stream = [lane for lane in lanes if not lane.endswith(BULK_SUFFIX)]
    if not stream:
        return None

    def merged(name: str) -> int:
        lane = registry.lane(name)[1]
        return lane.workers * lane.batch_size

    return max(stream, key=merged)


def warm_up(endpoints: Endpoints, lanes: list[str], seconds: float = 4.0, burst_seconds: float = 8.0) -> list[WarmUp]:
    """The JIT burst (where wrk is installed), then every stream lane for `seconds` and every bulk lane for a
    tenth of it (a few requests for its worker)."""
    warmed = []
    lane = burst_lane(lanes)
    if lane is not None:
        jit = burst(endpoints, lane, burst_seconds)
        if jit is None:
            print("warm-up: wrk is not installed, so the JVM's JIT is not paid before readiness (system-packages.sh test)")
        else:
            warmed.append(jit)
    # A bulk lane as a batch job loads it: its chunks at once, which the front door always admits.
    warmed += [
        warm_lane(endpoints, lane, seconds / 10, BULK_CLIENT_CHUNKS)
        if lane.endswith(BULK_SUFFIX)
        else warm_lane(endpoints, lane, seconds)
        for lane in lanes
    ]
    return warmed


def warm_version(
    endpoints: Endpoints, lane: str, version: str, max_seconds: float = 8.0, tolerance: float = 0.1, window_s: float = 1.0
) -> WarmUp:
    """The lane's own requests (sample_body) to /predictions/<lane>/<version>, in windows of `window_s`, until two
    windows in a row ran within `tolerance` of each other's rate or `max_seconds` passed (at least two windows).
    wrk at STREAM_CONNECTIONS (BULK_CONNECTIONS on a bulk lane); Python clients where wrk is missing."""
    connections = BULK_CONNECTIONS if lane.endswith(BULK_SUFFIX) else STREAM_CONNECTIONS
    body = sample_body(lane)
    rates: list[float] = []
    sent = failed = 0
    started = time.monotonic()
    steady = False
    while not steady:
        window = burst(endpoints, lane, window_s, connections, version, body)
        if window is None:
            window = warm_lane(endpoints, lane, window_s, connections, version, body)
            window = WarmUp(lane, window.requests, window.failed, window.seconds, version, (window.requests / window.seconds,))
        rates.append(window.rates[0])
        sent, failed = sent + window.requests, failed + window.failed
        steady = len(rates) >= 2 and abs(rates[-1] - rates[-2]) <= tolerance * max(rates[-1], rates[-2])
        if failed or time.monotonic() - started + window_s > max_seconds:
            break
    return WarmUp(lane, sent, failed, time.monotonic() - started, version, tuple(rates), steady)
