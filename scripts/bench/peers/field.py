"""The field: every serving system the stream lane is compared with, one file each, on the same terms.

Each peer module (flask_app, litserve_app, ray_serve_app, bentoml_app, pytriton_app) holds its own settings:
SETTINGS (per model, what `make bench` runs: the best of the last sweep, docs/benchmarks.md "Peers' sweeps")
and CANDIDATES (per model, what `python -m scripts.bench.sweep` tries), and a `start(archive, port, model,
settings)` context manager that serves the archive's core (scripts.archive.core.load_core: the same decode,
forward and encode as the lane) on 127.0.0.1:port and yields the URL to POST a request to once it answers.
`wrap` makes the wire body from the lane's body and `unwrap` turns the reply's JSON back into the lane's
answer, for a peer whose protocol puts its own envelope around them (Triton's KServe v2 JSON, BentoML's
parameters).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Settings = dict[str, Any]
Starter = Callable[[Path, int, str, Settings], AbstractContextManager[str]]


def _same(value):
    return value


@dataclass(frozen=True)
class Peer:
    name: str  # as the report names it
    key: str  # the sweep's --peer
    batching: bool  # dynamic batching on (the targets compare the lane with the best batching peer)
    start: Starter
    settings: dict[str, Settings]  # model -> the settings `make bench` runs
    candidates: dict[str, list[Settings]] = field(default_factory=dict)  # model -> the settings the sweep tries
    wrap: Callable[[bytes], bytes] = _same
    unwrap: Callable[[Any], Any] = _same

    def settings_for(self, model: str) -> Settings:
        return self.settings[model]


# Each lane's batchSize (config.properties): the batch size a batching peer's candidates start from.
LANE_BATCH = {"digits": 32, "minilm": 16}


def batching_peer(
    name: str, key: str, start: Starter, candidates: Callable[[int], list[Settings]], kept: dict[str, int], **protocol
) -> Peer:
    """A batching peer whose sweep tries `candidates(batch)` at each lane's batchSize and whose `make bench`
    settings are the candidates at `kept` (model -> index in them: the best of the last sweep)."""
    options = {model: candidates(batch) for model, batch in LANE_BATCH.items()}
    settings = {model: options[model][index] for model, index in kept.items()}
    return Peer(name=name, key=key, batching=True, start=start, settings=settings, candidates=options, **protocol)


def describe(settings: Settings) -> str:
    """`max_batch_size=32, batch_timeout=0.001`: a settings dict as one line for tables and logs."""
    return ", ".join(f"{key}={value}" for key, value in settings.items())
