"""The field: every serving system the stream lane is compared with, one file each, on the same terms.

Each peer module (flask_app, litserve_app, ray_serve_app, bentoml_app, pytriton_app) holds its own settings:
its candidates (at a model's stream lane batchSize: what `python -m scripts.bench.sweep` tries; each model's folder
keeps the index of the one `make bench` runs, model.yaml's bench.peers, the best of the last sweep, docs/benchmarks.md
"Peers' sweeps"), and a `start(archive, port, model,
settings)` context manager that serves the archive's core (scripts.archive.core.load_core: the same decode,
forward and encode as the lane) on 127.0.0.1:port and yields the URL to POST a request to once it answers.
`wrap` makes the wire body from the lane's body and `unwrap` turns the reply's JSON back into the lane's
answer, for a peer whose protocol puts its own envelope around them (Triton's KServe v2 JSON, BentoML's
parameters).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models import registry
from scripts.errors import ScriptError

Settings = dict[str, Any]
Starter = Callable[[Path, int, str, Settings], AbstractContextManager[str]]


def _same(value):
    return value


@dataclass(frozen=True)
class Peer:
    name: str  # as the report names it
    key: str  # the sweep's --peer, and the key of models/<name>/model.yaml's bench.peers
    batching: bool  # dynamic batching on (the targets compare the lane with the best batching peer)
    start: Starter
    candidates: Callable[[int], list[Settings]]  # the stream lane's batchSize -> the settings the sweep tries
    wrap: Callable[[bytes], bytes] = _same
    unwrap: Callable[[Any], Any] = _same
    pinned: Settings | None = None  # one candidate the sweep runs, whatever the model folder keeps

    def candidates_for(self, model: str) -> list[Settings]:
        """What the sweep tries for `model`: the candidates at its stream lane's batchSize (its model.yaml)."""
        return self.candidates(registry.model(model).stream_lane.batch_size)

    def settings_for(self, model: str) -> Settings:
        """What `make bench` runs for `model`: the candidate its model.yaml's bench.peers keeps for this peer (the
        best of the last sweep), the first where it names none."""
        if self.pinned is not None:
            return self.pinned
        options = self.candidates_for(model)
        index = registry.model(model).bench["peers"].get(self.key, 0)
        if index >= len(options):
            raise ScriptError(
                f"models/{model}/model.yaml: bench.peers.{self.key} is {index}, but {self.name} has {len(options)} "
                f"candidates (0..{len(options) - 1}; python -m scripts.bench.sweep --peer {self.key} lists them)"
            )
        return options[index]


def batching_peer(name: str, key: str, start: Starter, candidates: Callable[[int], list[Settings]], **protocol) -> Peer:
    """A batching peer whose sweep tries `candidates(batch)` at each model's stream lane batchSize."""
    return Peer(name=name, key=key, batching=True, start=start, candidates=candidates, **protocol)


def describe(settings: Settings) -> str:
    """`max_batch_size=32, batch_timeout=0.001`: a settings dict as one line for tables and logs."""
    return ", ".join(f"{key}={value}" for key, value in settings.items())
