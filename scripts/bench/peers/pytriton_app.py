"""Triton's dynamic batcher through PyTriton, serving the same core: settings from a sweep (SETTINGS, CANDIDATES).

nvidia-pytriton bundles the Triton server binary; the core runs as a Python inference callable bound with
`max_batch_size`, a DynamicBatcher (`max_queue_delay_microseconds`) and `instances` copies of the callable
(each its own core, one torch thread). PyTriton needs numpy<2 while the serving layer pins numpy 2, so it runs
from its own venv, build/peers/pytriton, made on first use from its lock (locks/peer-pytriton.txt, hashes checked;
`make lock` writes it from requirements-peer-pytriton.txt), with the tools venv's packages (torch, orjson,
tokenizers) after its own on sys.path.

Triton speaks the KServe v2 protocol: the lane's JSON body travels as one BYTES element of an input tensor,
`wrap` puts it there and `unwrap` takes the answer's JSON out of the output tensor.

    build/peers/pytriton/bin/python -m scripts.bench.peers.pytriton_app ARCHIVE PORT LANE SETTINGS_JSON   (child)
"""

from __future__ import annotations

import contextlib
import json
import os
import site
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from scripts.bench.peers.field import Settings, batching_peer
from scripts.bench.peers.process import running
from scripts.layout import BUILD, ROOT

VENV = BUILD / "peers" / "pytriton"
LOCK = ROOT / "locks" / "peer-pytriton.txt"


def ensure_venv() -> Path:
    """build/peers/pytriton's python, the venv made (once per lock) if it is missing."""
    python, stamp = VENV / "bin" / "python", VENV / ".installed"
    if not (stamp.exists() and stamp.read_text() == LOCK.read_text()):
        if not python.exists():
            subprocess.run(["python3.11", "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--require-hashes", "-r", str(LOCK)], check=True)
        stamp.write_text(LOCK.read_text())
    # The core's packages from the tools venv, after the peer's own (its numpy 1 wins over the tools' numpy 2).
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    (Path(purelib) / "zz-tools-venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def _libpython_first() -> str:
    """LD_LIBRARY_PATH with this Python's own libpython first. Triton's python-backend stub links libpython3.11 by
    name, and the loader finds Debian's (3.11.2) while the stub runs this Python's stdlib (3.11.7): 3.11.7's
    multiprocessing then fails on 3.11.2's C RLock ("'_thread.RLock' object has no attribute '_recursion_count'")."""
    own = Path(sysconfig.get_config_var("LIBDIR") or "")
    return ":".join(part for part in (str(own), os.environ.get("LD_LIBRARY_PATH", "")) if part)


def wrap(body: bytes) -> bytes:
    """The lane's body as Triton's KServe v2 JSON: one request of one BYTES element."""
    return json.dumps({"inputs": [{"name": "request", "datatype": "BYTES", "shape": [1, 1], "data": [body.decode()]}]}).encode()


def unwrap(reply):
    """Triton's v2 answer back to the lane's JSON: the output tensor's one BYTES element."""
    try:
        return json.loads(reply["outputs"][0]["data"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        return reply


@contextlib.contextmanager
def start(archive: Path, port: int, model: str, settings: Settings) -> Iterator[str]:
    from scripts.server.process import free_port

    ports = {"http": port, "grpc": free_port(), "metrics": free_port()}
    command = [str(ensure_venv()), "-m", "scripts.bench.peers.pytriton_app", str(archive), json.dumps(ports), model,
               json.dumps(settings)]  # fmt: skip
    base = f"http://127.0.0.1:{port}/v2/models/{model}"
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "LD_LIBRARY_PATH": _libpython_first()}
    with running(command, f"{base}/ready", env, timeout=120):
        yield f"{base}/infer"


def serve_forever(archive: str, ports: dict, lane: str, settings: Settings) -> None:
    import numpy as np
    import torch
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    from handlers.decoding import read_body
    from handlers.errors import RequestError
    from scripts.archive.core import load_core

    torch.set_num_threads(1)

    def callable_of(core):
        @batch
        def infer(request):
            payloads = []
            for item in request[:, 0]:
                try:
                    payloads.append(read_body(bytes(item), "application/json"))
                except RequestError as error:
                    payloads.append(error)
            answers = [json.dumps(answer.body).encode() for answer in core.answer(payloads)]
            return {"answer": np.array(answers, dtype=np.object_).reshape(-1, 1)}

        return infer

    config = TritonConfig(http_address="127.0.0.1", http_port=ports["http"], grpc_address="127.0.0.1",
                          grpc_port=ports["grpc"], metrics_port=ports["metrics"], log_verbose=0)  # fmt: skip
    with Triton(config=config) as triton:
        triton.bind(
            model_name=lane,
            infer_func=[callable_of(load_core(Path(archive))) for _ in range(settings["instances"])],
            inputs=[Tensor(name="request", dtype=bytes, shape=(1,))],
            outputs=[Tensor(name="answer", dtype=bytes, shape=(1,))],
            config=ModelConfig(
                max_batch_size=settings["max_batch_size"],
                batcher=DynamicBatcher(max_queue_delay_microseconds=settings["max_queue_delay_microseconds"]),
            ),
            strict=False,
        )
        triton.serve()


def _candidates(batch: int) -> list[Settings]:
    """Triton's dynamic batcher knobs: batch size, queue delay, model instances."""
    return [
        {"max_batch_size": batch, "max_queue_delay_microseconds": 1000, "instances": 2},
        {"max_batch_size": batch, "max_queue_delay_microseconds": 100, "instances": 2},
        {"max_batch_size": batch, "max_queue_delay_microseconds": 5000, "instances": 2},
        {"max_batch_size": batch, "max_queue_delay_microseconds": 1000, "instances": 1},
    ]


# The candidate each model runs: its model.yaml's bench.peers.
PEER = batching_peer("PyTriton", "pytriton", start, _candidates, wrap=wrap, unwrap=unwrap)


if __name__ == "__main__":
    archive, ports, lane, settings = sys.argv[1:]
    serve_forever(archive, json.loads(ports), lane, json.loads(settings))
