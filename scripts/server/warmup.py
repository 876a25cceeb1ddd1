"""Warm a started TorchServe before it takes traffic: `make serve`'s readiness (and the benchmarks' servers).

A fresh server is slow at first (docs/benchmarks.md, "Warm-up"): the JVM interprets the frontend's request path
until its JIT has compiled it, which takes some thousands of requests, and each worker's first calls into its
model are slower than later ones. Concurrent one-row requests to every stream lane for a few seconds pay both
before a client comes; the bulk lanes share the frontend's path and get a few requests for their workers.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson
import requests

from scripts.server.config import BULK_SUFFIX
from scripts.server.endpoints import Endpoints

SENTENCE = "A warm-up sentence for the text lanes."


@dataclass(frozen=True)
class WarmUp:
    lane: str
    requests: int
    failed: int
    seconds: float


def sample_body(lane: str) -> bytes:
    """One interactive request for the lane's model: a one-row digits grid, or a sentence for text lanes."""
    if lane.removesuffix(BULK_SUFFIX).startswith("minilm"):
        return orjson.dumps({"instances": [SENTENCE]})
    return orjson.dumps({"instances": [[0, 0, 5, 13, 9, 1, 0, 0] * 8]})


def warm_lane(endpoints: Endpoints, lane: str, seconds: float, concurrency: int = 8) -> WarmUp:
    """`concurrency` keep-alive clients sending one-row requests to `lane` for `seconds`."""
    url, body = endpoints.prediction_url(lane), sample_body(lane)
    headers = {"Content-Type": "application/json", **endpoints.auth("inference")}
    deadline = time.monotonic() + seconds

    def client() -> tuple[int, int]:
        sent = failed = 0
        with requests.Session() as session:
            while time.monotonic() < deadline:
                reply = session.post(url, data=body, headers=headers, timeout=60)
                sent, failed = sent + 1, failed + (reply.status_code != 200)
        return sent, failed

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda _: client(), range(concurrency)))
    return WarmUp(lane, sum(r[0] for r in results), sum(r[1] for r in results), time.monotonic() - started)


def warm_up(endpoints: Endpoints, lanes: list[str], seconds: float = 4.0) -> list[WarmUp]:
    """Every stream lane for `seconds`, every bulk lane for a tenth of it (a few requests for its worker)."""
    return [warm_lane(endpoints, lane, seconds / 10 if lane.endswith(BULK_SUFFIX) else seconds) for lane in lanes]
