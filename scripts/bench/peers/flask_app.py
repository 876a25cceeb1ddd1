"""The peer users start from: Flask behind gunicorn, one forward per request, the same core and JSON contract.

gunicorn runs `workers` gthread workers (keep-alive connections, `threads` request threads each: wrk keeps its
connections open, and a sync worker closes each after one answer), each loading the core from the archive
(scripts/archive/core.load_core) with torch limited to `torch_threads` intra-op threads, so they share the cores
as the lane's workers do. Workers x threads come from the sweep (CANDIDATES; docs/benchmarks.md, "Peers' sweeps").
POST /predictions/<lane> takes the same bodies as TorchServe (a raw item or {"instances": [...]}) and
answers the same JSON; the Authorization header is accepted and not checked.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from scripts.bench.peers.field import Peer, Settings
from scripts.bench.peers.process import running

ARCHIVE_ENV = "FLASK_PEER_ARCHIVE"
THREADS_ENV = "FLASK_PEER_TORCH_THREADS"


def create_app():
    """The WSGI app; gunicorn calls `scripts.bench.peers.flask_app:create_app()` in each worker."""
    import orjson
    import torch
    from flask import Flask, Response, request

    from handlers.decoding import read_body
    from handlers.errors import RequestError
    from scripts.archive.core import load_core

    torch.set_num_threads(int(os.environ.get(THREADS_ENV, "1")))
    torch.set_num_interop_threads(1)
    core = load_core(Path(os.environ[ARCHIVE_ENV]))
    app = Flask(__name__)

    @app.post("/predictions/<lane>")
    def predict(lane: str):
        try:
            payload = read_body(request.get_data())
        except RequestError as error:
            payload = error
        (answer,) = core.answer([payload])
        return Response(orjson.dumps(answer.body), status=answer.status, mimetype="application/json")

    @app.get("/ping")
    def ping():
        return {"status": "Healthy"}

    return app


@contextlib.contextmanager
def flask_peer(archive: Path, port: int, workers: int = 2, threads: int = 4, torch_threads: int = 1) -> Iterator[str]:
    """gunicorn serving `archive` on 127.0.0.1:`port`; yields its base URL once /ping answers; always stopped."""
    env = {ARCHIVE_ENV: str(archive), THREADS_ENV: str(torch_threads), "OMP_NUM_THREADS": str(torch_threads)}
    command = [sys.executable, "-m", "gunicorn", "--workers", str(workers), "--threads", str(threads),
               "--bind", f"127.0.0.1:{port}", "--worker-class", "gthread", "--keep-alive", "75",
               "--backlog", "2048", "--log-level", "warning", "scripts.bench.peers.flask_app:create_app()"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with running(command, url + "/ping", env):
        yield url


@contextlib.contextmanager
def start(archive: Path, port: int, model: str, settings: Settings) -> Iterator[str]:
    with flask_peer(archive, port, **settings) as url:
        yield f"{url}/predictions/{model}"


# Workers x request threads per worker (gthread), each worker with one torch thread; the one each model runs is its
# model.yaml's bench.peers (the best of the last `make bench-sweep`, docs/benchmarks.md "Peers' sweeps").
CANDIDATES = [{"workers": w, "threads": t} for w, t in ((2, 1), (2, 4), (4, 1), (4, 4))]
PEER = Peer(name="Flask", key="flask", batching=False, start=start, candidates=lambda batch: list(CANDIDATES))
