"""The BentoML service bentoml_app starts (`bentoml serve scripts.bench.peers.bentoml_service:Core`).

Its settings come from the environment, set by bentoml_app.start, because BentoML reads the batching settings
from the decorators when it imports this module.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import bentoml

SPEC = json.loads(os.environ.get("BENTOML_PEER_SETTINGS", '{"lane": "unset", "archive": "", "workers": 1}'))


@bentoml.service(workers=SPEC["workers"], traffic={"timeout": 60})
class Core:
    def __init__(self) -> None:
        import torch

        from scripts.archive.core import load_core

        torch.set_num_threads(1)
        self.core = load_core(Path(SPEC["archive"]))

    @bentoml.api(
        route=f"/predictions/{SPEC['lane']}",
        batchable=True,
        max_batch_size=SPEC.get("max_batch_size", 32),
        max_latency_ms=SPEC.get("max_latency_ms", 100),
    )
    def predict(self, instances: list[Any]) -> list[Any]:
        """One prediction per row of the batch: the rows of every request in it, as the lane's core answers them."""
        from handlers.decoding import read_body

        answers = self.core.answer([read_body({"instances": [row]}) for row in instances])
        return [answer.body["predictions"][0] if answer.status == 200 else answer.body for answer in answers]
