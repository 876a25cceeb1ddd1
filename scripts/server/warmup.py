"""Warm a started TorchServe before it takes traffic: `make serve`'s readiness (and the benchmarks' servers).

A fresh server is slow at first (docs/benchmarks.md, "Warm-up"): the JVM interprets the frontend's request path
until its JIT has compiled it, which takes some 50,000 requests (the first ~8 s at 64 connections here), and each
worker's first calls into its model are slower than later ones. So, before a client comes:
  - the JIT: a wrk burst (64 keep-alive connections, one-row requests) on one stream lane for `burst_seconds`;
    every lane shares the frontend's request path, so one lane pays it for all. wrk is a system package of the
    test layer (system-packages.sh); where it is missing the burst is skipped and said so (Python clients reach
    a few thousand requests in the same time, far too few: measured in docs/benchmarks.md);
  - the workers' first calls: concurrent one-row requests from Python to every stream lane for a few seconds,
    and a few requests to every bulk lane.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

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


WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {token}"
local file = io.open("{body}", "rb")
wrk.body = file:read("*a")
file:close()
"""


def burst(endpoints: Endpoints, lane: str, seconds: float, connections: int = 64) -> WarmUp | None:
    """wrk on `lane` for `seconds` at `connections` (the frontend's JIT); None where wrk is not installed."""
    wrk = shutil.which("wrk")
    if wrk is None or seconds <= 0:
        return None
    token = endpoints.token("inference")
    with tempfile.TemporaryDirectory(prefix="warmup-") as folder:
        body, script = Path(folder) / "body.json", Path(folder) / "post.lua"
        body.write_bytes(sample_body(lane))
        script.write_text(WRK_SCRIPT.format(token=token, body=body))
        command = [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", str(script)]
        started = time.monotonic()
        done = subprocess.run(
            [*command, endpoints.prediction_url(lane)], capture_output=True, text=True, timeout=seconds + 60, check=True
        )
    sent = re.search(r"(\d+) requests in", done.stdout)
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", done.stdout)
    lost = sum(int(n) for n in errors.groups()) if errors else 0
    return WarmUp(
        lane, int(sent.group(1)) if sent else 0, (int(failed.group(1)) if failed else 0) + lost, time.monotonic() - started
    )


def burst_lane(lanes: list[str]) -> str | None:
    """The stream lane the JIT burst goes to: a digits lane where there is one (the cheapest per request)."""
    stream = [lane for lane in lanes if not lane.endswith(BULK_SUFFIX)]
    return next((lane for lane in stream if lane.startswith("digits")), stream[0] if stream else None)


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
    warmed += [warm_lane(endpoints, lane, seconds / 10 if lane.endswith(BULK_SUFFIX) else seconds) for lane in lanes]
    return warmed
