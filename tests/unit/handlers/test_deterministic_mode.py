"""Deterministic mode: a row's scores are bitwise the same whatever shares its batch, on CPU, at any thread count."""

import random

import numpy as np
import pytest
import torch

from handlers.core import InferenceCore
from handlers.decoding import Payload
from models.digits.samples import digit_rows
from tests.unit.conftest import digits_settings

ROWS = digit_rows(40).instances


def scores_in_chunks(core: InferenceCore, chunk: int, seed: int) -> np.ndarray:
    """Every row's scores, sent in shuffled chunks of `chunk` rows (so each row meets other company)."""
    order = list(range(len(ROWS)))
    random.Random(seed).shuffle(order)
    scores: dict[int, list[float]] = {}
    for start in range(0, len(order), chunk):
        picked = order[start : start + chunk]
        answer = core.answer([Payload(items=[ROWS[i] for i in picked], raw=False)])[0]
        assert answer.status == 200
        scores.update(zip(picked, (p["scores"] for p in answer.body["predictions"]), strict=True))
    return np.array([scores[i] for i in range(len(ROWS))])


@pytest.mark.parametrize("max_batch_rows", [8, 32])
def test_bitwise_equal_across_batch_compositions_and_thread_counts(digits_model_dir, max_batch_rows):
    core = InferenceCore.load(
        digits_model_dir, digits_settings(deterministic=True, max_batch_rows=max_batch_rows), torch.device("cpu")
    )
    reference = scores_in_chunks(core, chunk=len(ROWS), seed=0)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for chunk, seed in ((1, 1), (3, 2), (max_batch_rows - 1, 3), (max_batch_rows + 5, 4)):
            assert np.array_equal(scores_in_chunks(core, chunk, seed), reference), (threads, chunk)
            assert torch.get_num_threads() == threads  # the caller's count is back after the passes


@pytest.mark.parametrize(("deterministic", "during_pass"), [(True, 1), (False, 2)])
def test_a_deterministic_pass_runs_on_one_thread_whatever_the_callers_count(digits_model_dir, deterministic, during_pass):
    core = InferenceCore.load(
        digits_model_dir, digits_settings(deterministic=deterministic, max_batch_rows=8), torch.device("cpu")
    )
    seen, forward = [], core.task.forward

    def watched(model, batch):
        seen.append(torch.get_num_threads())
        return forward(model, batch)

    core.task.forward = watched
    torch.set_num_threads(2)
    assert core.answer([Payload(items=ROWS[:20], raw=False)])[0].status == 200
    assert seen == [during_pass] * 3  # 20 rows in passes of 8
    assert torch.get_num_threads() == 2


def test_requests_merged_in_one_handler_call_equal_the_same_rows_alone(digits_model_dir):
    core = InferenceCore.load(digits_model_dir, digits_settings(deterministic=True, max_batch_rows=16), torch.device("cpu"))
    alone = [core.answer([Payload(items=[row], raw=False)])[0].body["predictions"][0] for row in ROWS[:12]]
    merged = core.answer([Payload(items=[row], raw=False) for row in ROWS[:12]])
    assert [response.body["predictions"][0] for response in merged] == alone
