"""The pod's warm-up: once TorchServe is up and every lane has a READY worker, the same warm-up as `make serve`
(scripts/server/warmup.py: a wrk burst for the frontend's JIT, then every lane's workers), and then the marker
the readiness check waits for (`<key dir>/warmed-up.json`, scripts/container/config.py's WARMED_MARKER). Before the
marker, every lane answers its model's samples (scripts/server/samples_gate.py, as hot-swap gates a new version):
the marker records each lane's verdict, and `healthcheck --ready` fails, naming the lane and the sample, while any
lane answers them otherwise than samples.json says; such a pod serves, but stays out of its Service.

The entry point runs this in a thread beside TorchServe (scripts/container/entrypoint.py); `healthcheck --ready`
fails until the marker is there, so neither the image's HEALTHCHECK nor the pod's readiness probe passes before
every lane has been warmed. The image carries Debian's wrk for the burst (docs/container.md, "Warm-up").
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import requests

from scripts.container.config import WARMED_MARKER
from scripts.container.healthcheck import check, endpoints_for
from scripts.errors import ScriptError
from scripts.server.config import ServerConfig
from scripts.server.samples_gate import gate
from scripts.server.warmup import WarmUp, warm_up

POLL_S = 1.0


def marker(key_file: Path) -> Path:
    return key_file.with_name(WARMED_MARKER)


def wait_ready(config: Path, key_file: Path, stop: threading.Event, poll_s: float = POLL_S) -> bool:
    """Until /ping is healthy and every lane has a READY worker (True), or `stop` is set (False)."""
    while not stop.is_set():
        try:
            check(config, key_file, ready=True)
            return True
        except ScriptError:  # no key file yet, not listening yet, a lane still loading
            stop.wait(poll_s)
    return False


def warm(config: Path, key_file: Path, seconds: float = 4.0, burst_seconds: float = 8.0) -> list[WarmUp]:
    """Warm every lane config.properties loads, gate each on its model's samples, then write the marker with what
    the warm-up sent and each gate's verdict (a failed gate keeps `healthcheck --ready` failing)."""
    lanes = ServerConfig.read(config).lanes()
    started = time.monotonic()
    endpoints = endpoints_for(config, key_file)
    warmed = warm_up(endpoints, lanes, seconds, burst_seconds)
    gates = gated(endpoints, lanes)
    record = {
        "lanes": lanes,
        "seconds": round(time.monotonic() - started, 1),
        "warm_ups": [{"lane": w.lane, "requests": w.requests, "failed": w.failed} for w in warmed],
        **gates,
    }
    marker(key_file).write_text(json.dumps(record, indent=2) + "\n")
    failed = sum(w.failed for w in warmed)
    print(
        f"warmed up {', '.join(lanes)} with {sum(w.requests for w in warmed):,} requests in {record['seconds']:.0f}s"
        + (f" ({failed} failed)" if failed else "")
        + f"; {verdict(gates)}",
        flush=True,
    )
    return warmed


def gated(endpoints, lanes: list[str]) -> dict[str, Any]:
    """Every lane through its samples gate: the marker's `samples` (each lane's verdict) and `failed_gates` (what
    `healthcheck --ready` refuses on)."""
    results = [gate(endpoints, lane) for lane in lanes]
    return {
        "samples": {result.lane: result.summary() for result in results},
        "failed_gates": [result.summary() for result in results if not result.passed],
    }


def verdict(gates: dict[str, Any]) -> str:
    if gates["failed_gates"]:
        return "NOT READY, answers its samples wrongly: " + "; ".join(gates["failed_gates"])
    return f"every lane answers its samples as samples.json says ({len(gates['samples'])} lanes): ready"


def warm_when_ready(config: Path, key_file: Path, stop: threading.Event) -> None:
    """The entry point's thread: wait for the lanes, warm them, gate them, mark. A warm-up that breaks (wrk failing,
    say) is said and the lanes gated and marked without it, so a pod that serves rightly is not kept out of its
    Service for good."""
    if not wait_ready(config, key_file, stop):
        return
    try:
        warm(config, key_file)
    except (ScriptError, OSError, ValueError, requests.RequestException) as error:
        if stop.is_set():
            return
        # Still gated: a pod that answers its samples wrongly stays out of its Service, warmed or not.
        gates = gated(endpoints_for(config, key_file), ServerConfig.read(config).lanes())
        print(f"warm-up failed ({error}); the lanes without it: {verdict(gates)}", flush=True)
        marker(key_file).write_text(json.dumps({"error": str(error), **gates}) + "\n")
