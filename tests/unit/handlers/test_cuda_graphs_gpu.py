"""CUDA graphs captured and replayed on a GPU (`make gpu-check`, or the device scripts in scripts/gpu/device/):
answers equal to eager, eager above the largest bucket, the graphs' memory counted. Deselected elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handlers.core import InferenceCore, select_device
from handlers.decoding import Payload
from handlers.settings import HandlerSettings
from models.digits.samples import held_out
from models.minilm.samples import cosines, varied_sentences
from tests.unit.formats.conftest import digits_file, format_minilm_core, minilm_file

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def digits_core(**handler) -> InferenceCore:
    path = digits_file("export")
    settings = {"task": "digit_classification", "model_file": path.name, "max_batch_rows": 64, **handler}
    return InferenceCore.load(path.parent, HandlerSettings.from_yaml({"handler": settings}), select_device(0))


def scores(core: InferenceCore, grids) -> np.ndarray:
    [response] = core.answer([Payload(items=[g.tolist() for g in grids], raw=False)])
    return np.array([p["scores"] for p in response.body["predictions"]])


def test_digits_replayed_equal_eager_in_every_bucket_and_above():
    eager, graphed = digits_core(), digits_core(cuda_graphs=True)
    runner = graphed.capture_graphs(32)
    assert runner.row_buckets == (1, 2, 4, 8, 16, 32) and runner.memory_bytes > 0
    grids, _ = held_out(40)
    for rows in (1, 3, 8, 17, 32, 40):  # 40: above the largest bucket, eager
        np.testing.assert_allclose(scores(graphed, grids[:rows]), scores(eager, grids[:rows]), atol=1e-6)


def test_minilm_replayed_equal_eager():
    eager = format_minilm_core(minilm_file("export"), select_device(0))
    graphed = format_minilm_core(minilm_file("export"), select_device(0))
    runner = graphed.capture_graphs(8)
    assert runner.length_buckets[0] == 16
    texts = varied_sentences(60)[:8]
    for count in (1, 5, 8):
        [a] = eager.answer([Payload(items=texts[:count], raw=False)])
        [b] = graphed.answer([Payload(items=texts[:count], raw=False)])
        first = np.array([p["embedding"] for p in a.body["predictions"]])
        second = np.array([p["embedding"] for p in b.body["predictions"]])
        assert cosines(second, first).min() >= 0.99999
