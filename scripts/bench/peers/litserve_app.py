"""LitServe with its batching on, serving the same core; its settings from a sweep (SETTINGS, CANDIDATES).

LitServe's default (JSON) endpoint: the body must be JSON, so the benchmark sends the one-row
{"instances": [...]} body; the answer is the same JSON as TorchServe's. `workers_per_device` inference
processes with torch limited to one thread each, behind `num_api_servers` uvicorn front processes;
`fast_queue` moves requests over ZeroMQ instead of multiprocessing queues. Error answers keep
status 200 with the error object as body (LitServe sets statuses through HTTPException; the benchmark
sends only good requests).

    python -m scripts.bench.peers.litserve_app ARCHIVE PORT LANE SETTINGS_JSON   (child process)
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import litserve as ls

from scripts.bench.peers.field import Settings, batching_peer
from scripts.bench.peers.process import running


class CoreAPI(ls.LitAPI):
    """decode -> core.answer over LitServe's batch -> the handler's JSON bodies. At module level:
    LitServe pickles the API object into its inference workers."""

    def __init__(self, archive: str, threads: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.archive = archive
        self.threads = threads

    def setup(self, device):
        import torch

        from scripts.archive.core import load_core

        torch.set_num_threads(self.threads)
        self.core = load_core(Path(self.archive))

    def decode_request(self, request):
        from handlers.decoding import read_body
        from handlers.errors import RequestError

        try:
            return read_body(request)
        except RequestError as error:
            return error

    def batch(self, inputs):
        return list(inputs)

    def predict(self, payloads):
        return [response.body for response in self.core.answer(payloads)]

    def unbatch(self, outputs):
        return outputs

    def encode_response(self, output):
        return output


@contextlib.contextmanager
def litserve_peer(archive: Path, port: int, lane: str, settings: Settings) -> Iterator[str]:
    """LitServe serving `archive` on 127.0.0.1:`port`; yields the base URL once /health answers; always stopped."""
    settings = {**DEFAULTS, **settings}
    command = [sys.executable, "-m", "scripts.bench.peers.litserve_app", str(archive), str(port), lane, json.dumps(settings)]
    url = f"http://127.0.0.1:{port}"
    with running(command, url + "/health", {"OMP_NUM_THREADS": str(settings["threads"])}):
        yield url


@contextlib.contextmanager
def start(archive: Path, port: int, model: str, settings: Settings) -> Iterator[str]:
    with litserve_peer(archive, port, model, settings) as url:
        yield f"{url}/predictions/{model}"


def serve(archive: str, port: int, lane: str, settings: Settings) -> None:
    api = CoreAPI(archive, settings["threads"], max_batch_size=settings["max_batch_size"],
                  batch_timeout=settings["batch_timeout"], api_path=f"/predictions/{lane}")  # fmt: skip
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=settings["workers_per_device"],
                          fast_queue=settings["fast_queue"])  # fmt: skip
    server.run(host="127.0.0.1", port=port, num_api_servers=settings["num_api_servers"], log_level="warning",
               generate_client_file=False)  # fmt: skip


DEFAULTS: Settings = {"workers_per_device": 2, "num_api_servers": 1, "fast_queue": False, "threads": 1}


def _candidates(batch: int) -> list[Settings]:
    """LitServe's knobs as its docs present them: batch size and timeout, inference workers, API servers, fast_queue."""
    return [
        {"max_batch_size": batch, "batch_timeout": 0.001, "workers_per_device": 2, "num_api_servers": 1, "fast_queue": False},
        {"max_batch_size": batch, "batch_timeout": 0.005, "workers_per_device": 2, "num_api_servers": 1, "fast_queue": True},
        {"max_batch_size": batch, "batch_timeout": 0.001, "workers_per_device": 2, "num_api_servers": 2, "fast_queue": True},
        {"max_batch_size": batch, "batch_timeout": 0.005, "workers_per_device": 1, "num_api_servers": 2, "fast_queue": True},
        {"max_batch_size": batch * 2, "batch_timeout": 0.01, "workers_per_device": 2, "num_api_servers": 2, "fast_queue": True},
    ]


# The candidate each model runs: its model.yaml's bench.peers.
PEER = batching_peer("LitServe", "litserve", start, _candidates)


if __name__ == "__main__":
    archive, port, lane, settings = sys.argv[1:]
    serve(archive, int(port), lane, {**DEFAULTS, **json.loads(settings)})
