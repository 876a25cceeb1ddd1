"""One TorchServe batch mixing good requests with every kind of bad one, for each task: each bad request gets
its own 4xx naming the problem, the good ones their correct answers (digit labels and scores, minilm
embeddings) equal to the in-process core's within 1e-5, and the worker stays the same process.

A lane registered for this module batches them: batchSize 32 and maxBatchDelay 1000 ms, so requests sent
together reach the handler in one call (X-Batch-Requests says how many it held). They go to TorchServe's own
listener: the front door serves only the configured lanes and refuses forms before any batch (test_front_door.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from handlers.decoding import read_body
from models.digits.samples import grid_png, held_out
from models.minilm.samples import varied_sentences
from scripts.archive.core import load_core
from scripts.clients.load import send_concurrently
from scripts.server.config import LaneSettings
from scripts.swap.management import ManagementApi
from tests.malformed import (
    JSON,
    LONE_SURROGATE_JSON,
    NAN_JSON,
    NOT_AN_IMAGE,
    NOT_UTF8,
    PNG,
    TEXT,
    digits_row,
    instances,
    png_header,
    rows,
    truncated_png,
)

MIXED = LaneSettings(batch_size=32, max_batch_delay=1000, response_timeout=120, workers=1)


@dataclass(frozen=True)
class Bad:
    name: str
    body: bytes
    media: str
    code: int
    message: str


DIGITS_BAD = [
    Bad("63 values", instances([[1] * 63]), JSON, 400, "instances[0]: expected 64 values in 0..16 (or an 8x8 list), got 63"),
    Bad(
        "value over 16", instances([digits_row(), digits_row(17)]), JSON, 400, "instances[1]: expected 64 values in 0..16, got 17"
    ),
    Bad("NaN", NAN_JSON, JSON, 400, "body is not valid JSON"),
    Bad("row of wrong type", instances(["7"]), JSON, 400, "instances[0]: expected 64 numbers"),
    Bad("b64 not base64", instances([{"b64": "!!"}]), JSON, 400, "b64 is not valid base64"),
    Bad("not an image", NOT_AN_IMAGE, PNG, 400, "not a readable image"),
    Bad("truncated PNG", truncated_png(), PNG, 400, "image file is truncated"),
    Bad("huge-pixel PNG", png_header(60000, 60000), PNG, 413, "over the limit of 1048576 pixels"),
    Bad(
        "too many rows", rows(1025), JSON, 413, "takes at most 1024 rows per request (handler.max_request_rows): send it to lane"
    ),
    Bad("invalid JSON", b'{"instances": [', JSON, 400, "not valid JSON"),
    Bad("JSON array", b"[1]", JSON, 400, "got a JSON array"),
    Bad("unknown field", b'{"instances": [[0]], "x": 1}', JSON, 400, "unknown field(s) ['x']"),
    Bad("empty body", b"", PNG, 400, "empty request body"),
    Bad("text to the image model", b"seven", TEXT, 415, "Content-Type text/plain is not read here"),
]
MINILM_BAD = [
    Bad("text not UTF-8", NOT_UTF8, TEXT, 400, "body must be UTF-8 text"),
    Bad("text over the byte limit", b"x" * 65537, TEXT, 413, "over the limit of 65536 bytes"),
    Bad("instance over the byte limit", instances(["ok", "x" * 65537]), JSON, 413, "instances[1]: text is 65537 bytes"),
    Bad("instance not a string", instances([1.5]), JSON, 400, "instances[0]: expected a string, got float"),
    Bad("lone surrogate", LONE_SURROGATE_JSON, JSON, 400, "body is not valid JSON"),
    Bad("too many rows", rows(33), JSON, 413, "takes at most 32 rows per request (handler.max_request_rows): send it to lane"),
    Bad("invalid JSON", b'{"instances": ["a",', JSON, 400, "not valid JSON"),
    Bad("JSON string", b'"a sentence"', JSON, 400, "got a JSON string"),
    Bad("JSON without instances", b'{"text": "a"}', JSON, 400, "got keys ['text']"),
    Bad("unknown field", b'{"instances": ["a"], "x": 1}', JSON, 400, "unknown field(s) ['x']"),
    Bad("empty body", b"", TEXT, 400, "empty request body"),
    Bad("image to the text model", png_header(8, 8), PNG, 415, "Content-Type image/png is not read here"),
]


def mixed_lane(server, archive: str):
    """`<model>-mixed`: `archive` registered with batching that holds concurrent requests together."""
    lane = archive.removesuffix(".mar") + "-mixed"
    api = ManagementApi(server.server.torchserve_endpoints)
    api.register(lane, server.model_store / archive, MIXED)
    try:
        yield lane
    finally:
        for state in api.versions(lane):
            api.unregister(lane, state.version)


@pytest.fixture(scope="module")
def digits_mixed(digits_server):
    yield from mixed_lane(digits_server, "digits.mar")


@pytest.fixture(scope="module")
def minilm_mixed(minilm_server):
    yield from mixed_lane(minilm_server, "minilm.mar")


def interleave(good: list, bad: list) -> list:
    """Good and bad items alternating, the longer list's rest at the end."""
    mixed = [item for pair in zip(good, bad, strict=False) for item in pair]
    return mixed + good[len(bad) :] + bad[len(good) :]


def send_mixed(server, lane: str, good: list[tuple[bytes, str]], bad: list[Bad]):
    """Every request at once; (answers to the good ones in order, answers to the bad ones in order)."""
    items = interleave([("good", body, media) for body, media in good], [("bad", b.body, b.media) for b in bad])
    pids = [state.worker_pids for state in ManagementApi(server.server.torchserve_endpoints).versions(lane)]
    answers = send_concurrently(
        server.server.torchserve_endpoints, lane, [i[1] for i in items], [i[2] for i in items], clients=len(items)
    )
    assert [state.worker_pids for state in ManagementApi(server.server.torchserve_endpoints).versions(lane)] == pids
    assert all(answer.batch_requests > 1 for answer in answers), [answer.batch_requests for answer in answers]
    good_answers = [answer for item, answer in zip(items, answers, strict=True) if item[0] == "good"]
    bad_answers = [answer for item, answer in zip(items, answers, strict=True) if item[0] == "bad"]
    return good_answers, bad_answers


def check_refusals(bad: list[Bad], answers) -> None:
    for case, answer in zip(bad, answers, strict=True):
        assert answer.reply.status_code == case.code, (case.name, answer.reply.text[:300])
        assert case.message in answer.reply.json()["message"], case.name


def test_digits_bad_items_of_every_kind_fail_alone_in_a_batch_with_good_ones(digits_server, digits_mixed):
    grids, labels = held_out(12)
    good = [(grid_png(grid), PNG) for grid in grids[:8]]
    good += [(instances(grids[8:10].tolist()), JSON), (instances(grids[10:].reshape(2, -1).tolist()), JSON)]
    good_answers, bad_answers = send_mixed(digits_server, digits_mixed, good, DIGITS_BAD)
    check_refusals(DIGITS_BAD, bad_answers)
    assert [answer.reply.status_code for answer in good_answers] == [200] * len(good)
    results = [a.reply.json() for a in good_answers[:8]] + [p for a in good_answers[8:] for p in a.reply.json()["predictions"]]
    assert [result["label"] for result in results] == labels.tolist()
    core = load_core(digits_server.model_store / "digits.mar")
    expected = [response.body for response in core.answer([read_body(body, media) for body, media in good])]
    expected = expected[:8] + [p for body in expected[8:] for p in body["predictions"]]
    np.testing.assert_allclose([r["scores"] for r in results], [e["scores"] for e in expected], atol=1e-5)


def test_minilm_bad_items_of_every_kind_fail_alone_in_a_batch_with_good_ones(minilm_server, minilm_mixed):
    sentences = varied_sentences()[:14]
    good = [(text.encode(), TEXT) for text in sentences[:8]] + [
        (instances(sentences[8:11]), JSON),
        (instances(sentences[11:]), JSON),
    ]
    good_answers, bad_answers = send_mixed(minilm_server, minilm_mixed, good, MINILM_BAD)
    check_refusals(MINILM_BAD, bad_answers)
    assert [answer.reply.status_code for answer in good_answers] == [200] * len(good)
    results = [a.reply.json() for a in good_answers[:8]] + [p for a in good_answers[8:] for p in a.reply.json()["predictions"]]
    core = load_core(minilm_server.model_store / "minilm.mar")
    expected = [p for p in core.answer([read_body(instances(sentences), JSON)])[0].body["predictions"]]
    assert len(results) == len(sentences)
    np.testing.assert_allclose([r["embedding"] for r in results], [e["embedding"] for e in expected], atol=1e-5)
