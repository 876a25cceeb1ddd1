"""BentoML with adaptive batching, serving the same core: settings from a sweep (SETTINGS, CANDIDATES).

`bentoml serve scripts.bench.peers.bentoml_service:Core` with the settings in the environment (the service's
decorators read them at import): `workers` processes, each loading the core with one torch thread, and one
batchable API at /predictions/<lane> whose adaptive batcher (`max_batch_size`, `max_latency_ms`) joins the
requests' rows. BentoML maps a JSON body's fields to the API's parameters, so the lane's body
{"instances": [row]} is the same body here; its answer is the list of predictions, [prediction], which `unwrap`
puts back in the lane's {"predictions": [...]} for the answer check.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from scripts.bench.peers.field import Peer, Settings
from scripts.bench.peers.process import running
from scripts.layout import ROOT

SETTINGS_ENV = "BENTOML_PEER_SETTINGS"


@contextlib.contextmanager
def start(archive: Path, port: int, model: str, settings: Settings) -> Iterator[str]:
    spec = {**settings, "archive": str(archive), "lane": model}
    command = [str(Path(sys.executable).parent / "bentoml"), "serve", "scripts.bench.peers.bentoml_service:Core",
               "--host", "127.0.0.1", "--port", str(port), "--working-dir", str(ROOT)]  # fmt: skip
    env = {SETTINGS_ENV: json.dumps(spec), "OMP_NUM_THREADS": "1", "BENTOML_DO_NOT_TRACK": "True", "PYTHONPATH": str(ROOT)}
    with running(command, f"http://127.0.0.1:{port}/readyz", env, log_name="bentoml"):
        yield f"http://127.0.0.1:{port}/predictions/{model}"


def unwrap(answer):
    """BentoML answers the API's return value, the request's predictions: the lane's body has them under "predictions"."""
    return {"predictions": answer} if isinstance(answer, list) else answer


LATENCIES_MS = (10, 100, 1000, 5000)


def _candidates(batch: int) -> list[Settings]:
    """BentoML's adaptive batching knobs (max_batch_size, max_latency_ms) and its service workers."""
    found = [{"max_batch_size": batch, "max_latency_ms": ms, "workers": 2} for ms in LATENCIES_MS]
    return found + [{"max_batch_size": batch, "max_latency_ms": LATENCIES_MS[-1], "workers": 1}]


# The candidate each model runs: its model.yaml's bench.peers.
PEER = Peer(name="BentoML", key="bentoml", batching=True, start=start, candidates=_candidates, unwrap=unwrap)
