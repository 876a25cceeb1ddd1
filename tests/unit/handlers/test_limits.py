"""The shipped limits hold together: every lane config.properties loads has a row limit, and the answer to
its largest request fits in max_response_size (TorchServe restarts a worker whose answer is larger)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import torch
import yaml

from handlers.settings import HandlerSettings
from handlers.tasks import build_task
from handlers.tasks.text_embedding import TokenizedText
from scripts.layout import ROOT
from scripts.server.config import DEFAULT_MAX_REQUEST_SIZE, ServerConfig

CONFIG = ServerConfig.read()
# TorchServe's default max_response_size is the same number as its max_request_size default.
MAX_RESPONSE = int(CONFIG.get("max_response_size", str(DEFAULT_MAX_REQUEST_SIZE)))
OUTPUTS = {"digit_classification": 10, "text_embedding": 384, "image_classification": 1000}


def settings_of(archive: str) -> HandlerSettings:
    model = archive.removesuffix(".mar")
    return HandlerSettings.from_yaml(yaml.safe_load((ROOT / "models" / model / "model-config.yaml").read_text()))


def longest_float32() -> float:
    """The float32 value whose JSON form is longest, among many small negative ones (e.g. -1.2345677e-05)."""
    values = -np.random.default_rng(0).random(20_000).astype(np.float32) * np.float32(1e-5)
    return max(values.tolist(), key=lambda value: len(orjson.dumps(value)))


def worst_answer_bytes(settings: HandlerSettings, rows: int, model: str) -> int:
    """The size of {"predictions": [...]} for `rows` rows whose every number (and class name) has the longest form."""
    task = build_task(settings)
    if settings.task == "image_classification":  # names come with the model: each the longest of them
        names = orjson.loads((ROOT / "models" / model / task.options.labels_file).read_bytes())
        task.labels = [max(names, key=len)] * len(names)
    outputs = torch.full((1, OUTPUTS[settings.task]), longest_float32(), dtype=torch.float32)
    row = TokenizedText(ids=[101, 102], truncated=False) if settings.task == "text_embedding" else None
    [answer] = task.unbatch(outputs, [row])
    return len(orjson.dumps({"predictions": [answer]})) + (rows - 1) * (len(orjson.dumps(answer)) + 1)


@pytest.mark.parametrize(("lane", "archive"), sorted(CONFIG.loaded_lanes().items()))
def test_every_lane_has_a_row_limit_whose_largest_answer_fits_in_max_response_size(lane, archive):
    settings = settings_of(archive)
    rows = settings.rows_for(lane)
    assert rows is not None, f"lane {lane} has no row limit: its answer could exceed max_response_size"
    assert worst_answer_bytes(settings, rows, archive.removesuffix(".mar")) <= MAX_RESPONSE


def test_the_stream_lanes_send_large_requests_to_their_bulk_lane():
    for lane, archive in CONFIG.loaded_lanes().items():
        settings = settings_of(archive)
        if lane.endswith("-bulk"):
            assert settings.rows_for(lane) > settings.rows_for(lane.removesuffix("-bulk"))
        else:
            assert f"{lane}-bulk" in settings.named_lanes_rows()
