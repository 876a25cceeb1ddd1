"""Ray Serve with `@serve.batch`, serving the same core: settings from a sweep (SETTINGS, CANDIDATES).

The child process starts a Ray of its own on 127.0.0.1 (`num_cpus` 2, no dashboard), Serve's HTTP proxy on
the given port, and one deployment at /predictions/<lane> with `num_replicas` replicas (each loading the core,
one torch thread) and `max_ongoing_requests` per replica; each replica batches requests with `@serve.batch`
(`max_batch_size`, `batch_wait_timeout_s`) and runs the core over the batch. A GET on the same path answers 200
once a replica is up (the harness's health check). The body and the answer are the lane's JSON.

    python -m scripts.bench.peers.ray_serve_app ARCHIVE PORT LANE SETTINGS_JSON   (child process)
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from scripts.bench.peers.field import Settings, batching_peer
from scripts.bench.peers.process import running
from scripts.errors import ServerError
from scripts.layout import ROOT
from scripts.server.process import free_port

BIND_ATTEMPTS = 3


@contextlib.contextmanager
def start(archive: Path, port: int, model: str, settings: Settings) -> Iterator[str]:
    """The peer on `port`; on another free port when Ray's own processes took that one first (its proxy then fails
    "Failed to bind to address"): ray.init starts a dozen listeners on random ports before the proxy binds."""
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
    with contextlib.ExitStack() as stack:
        for attempt in range(1, BIND_ATTEMPTS + 1):
            url = f"http://127.0.0.1:{port}/predictions/{model}"
            command = [sys.executable, "-m", "scripts.bench.peers.ray_serve_app", str(archive), str(port), model]
            try:
                stack.enter_context(running([*command, json.dumps(settings)], url, env))
                break
            except ServerError as error:
                if "Failed to bind" not in str(error) or attempt == BIND_ATTEMPTS:
                    raise
                port = free_port()
        yield url


def serve_forever(archive: str, port: int, lane: str, settings: Settings) -> None:
    import orjson
    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    @serve.deployment(
        num_replicas=settings["num_replicas"],
        max_ongoing_requests=settings["max_ongoing_requests"],
        ray_actor_options={"num_cpus": 0},
    )
    class Core:
        def __init__(self) -> None:
            import torch

            from scripts.archive.core import load_core

            torch.set_num_threads(1)
            self.core = load_core(Path(archive))
            self.batched.set_max_batch_size(settings["max_batch_size"])
            self.batched.set_batch_wait_timeout_s(settings["batch_wait_timeout_s"])

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.001)
        async def batched(self, payloads: list) -> list:
            return self.core.answer(payloads)

        async def __call__(self, request: Request) -> Response:
            from handlers.decoding import read_body
            from handlers.errors import RequestError

            if request.method == "GET":
                return Response(b'{"status":"Healthy"}', media_type="application/json")
            try:
                payload = read_body(await request.body())
            except RequestError as error:
                payload = error
            answer = await self.batched(payload)
            return Response(orjson.dumps(answer.body), status_code=answer.status, media_type="application/json")

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    serve.start(
        http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "WARNING", "enable_access_log": False}
    )
    serve.run(Core.bind(), route_prefix=f"/predictions/{lane}", name=lane)
    while True:
        time.sleep(3600)


def _candidates(batch: int) -> list[Settings]:
    """Ray Serve's knobs from its batching guide: batch size and wait, replicas, ongoing requests per replica."""
    return [
        {"max_batch_size": batch, "batch_wait_timeout_s": 0.001, "num_replicas": 2, "max_ongoing_requests": 64},
        {"max_batch_size": batch, "batch_wait_timeout_s": 0.005, "num_replicas": 2, "max_ongoing_requests": 64},
        {"max_batch_size": batch, "batch_wait_timeout_s": 0.001, "num_replicas": 1, "max_ongoing_requests": 128},
        {"max_batch_size": batch * 2, "batch_wait_timeout_s": 0.01, "num_replicas": 2, "max_ongoing_requests": 128},
    ]


# The candidate each model runs: its model.yaml's bench.peers.
PEER = batching_peer("Ray Serve", "ray", start, _candidates)


if __name__ == "__main__":
    archive, port, lane, settings = sys.argv[1:]
    serve_forever(archive, int(port), lane, json.loads(settings))
