"""LitServe with its batching on, serving the same core: max_batch_size and batch_timeout like the lane's.

LitServe's default (JSON) endpoint: the body must be JSON, so the benchmark sends the one-row
{"instances": [...]} body; the answer is the same JSON as TorchServe's. `workers` inference processes
with torch limited to `threads` threads each, behind one uvicorn front process. Error answers keep
status 200 with the error object as body (LitServe sets statuses through HTTPException; the benchmark
sends only good requests).

    python -m scripts.bench.peers.litserve_app ARCHIVE PORT LANE BATCH TIMEOUT_S WORKERS THREADS   (child process)
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import litserve as ls

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
def litserve_peer(archive: Path, port: int, lane: str, max_batch_size: int, batch_timeout_s: float, workers: int = 2,
                  threads: int = 1) -> Iterator[str]:  # fmt: skip
    """LitServe serving `archive` on 127.0.0.1:`port`; yields the base URL once /health answers; always stopped."""
    settings = [str(archive), str(port), lane, str(max_batch_size), str(batch_timeout_s), str(workers), str(threads)]
    command = [sys.executable, "-m", "scripts.bench.peers.litserve_app", *settings]
    url = f"http://127.0.0.1:{port}"
    with running(command, url + "/health", {"OMP_NUM_THREADS": str(threads)}):
        yield url


def serve(archive: str, port: int, lane: str, max_batch_size: int, batch_timeout_s: float, workers: int, threads: int) -> None:
    api = CoreAPI(archive, threads, max_batch_size=max_batch_size, batch_timeout=batch_timeout_s, api_path=f"/predictions/{lane}")
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=workers)
    server.run(host="127.0.0.1", port=port, num_api_servers=1, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    archive, port, lane, batch, timeout, workers, threads = sys.argv[1:]
    serve(archive, int(port), lane, int(batch), float(timeout), int(workers), int(threads))
