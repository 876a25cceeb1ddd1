"""Malformed requests over REST against a real TorchServe, one table: each gets a 4xx whose message names the
problem, and the lane's workers are the same processes afterwards (none crashed or restarted).

Forms, multipart bodies, content types a lane does not read, bodies over a lane's byte limit and unknown lanes
are the front door's answers (docs/front-door.md), before TorchServe's frontend sees a byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import requests

from tests.integration.serving.bad_input import OVER_MAX_REQUEST_SIZE, sent_body, server_and_watched_lane, worker_pids
from tests.malformed import (
    DEEP_JSON,
    INFINITY_JSON,
    JSON,
    LONE_SURROGATE_JSON,
    NAN_JSON,
    NOT_AN_IMAGE,
    NOT_UTF8,
    NUL_BYTES,
    PNG,
    TEXT,
    digits_row,
    instances,
    png_header,
    rows,
    truncated_png,
)

FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data; boundary=x"
MULTIPART_FILE = b'--x\r\nContent-Disposition: form-data; name="file"\r\nContent-Type: image/png\r\n\r\nPNG\r\n--x--\r\n'


@dataclass(frozen=True)
class Case:
    name: str
    lane: str
    body: bytes
    media: str | None  # the Content-Type header; None sends none
    code: int
    message: str  # a part of the answer's message ("" where TorchServe answers with an empty body)
    method: str = "POST"


CASES = [
    # -- the body as a whole
    Case("empty body", "digits", b"", PNG, 400, "empty request body"),
    Case("empty JSON body", "digits", b"", JSON, 400, "empty request body (Content-Type application/json)"),
    Case("GET without a body", "digits", b"", None, 400, "empty request body", method="GET"),
    Case("invalid JSON", "digits", b'{"instances": [[1, 2', JSON, 400, "not valid JSON (Content-Type application/json)"),
    Case("invalid JSON as text to minilm", "minilm", b'{"instances": ["a"', JSON, 400, "not valid JSON"),
    Case("broken JSON, no content type", "digits", b'{"instances": [', None, 400, 'not valid JSON (it starts with "{")'),
    Case("JSON array", "digits", b"[[0, 1]]", JSON, 400, "got a JSON array"),
    Case("JSON string", "minilm", b'"a sentence"', JSON, 400, "got a JSON string"),
    Case("JSON number", "digits", b"7", JSON, 400, "got a JSON number"),
    Case("JSON null", "digits", b"null", JSON, 400, "got a JSON null"),
    Case("missing instances", "digits", b'{"inputs": [1]}', JSON, 400, "'instances' list, got keys ['inputs']"),
    Case("unknown field", "digits", b'{"instances": [[0]], "parameters": {}}', JSON, 400, "unknown field(s) ['parameters']"),
    Case("empty instances", "digits", instances([]), JSON, 400, "'instances' must be a non-empty JSON list"),
    Case("instances not a list", "minilm", b'{"instances": "a"}', JSON, 400, "'instances' must be a non-empty JSON list"),
    Case("deeply nested JSON", "digits", DEEP_JSON, JSON, 400, "not valid JSON (Content-Type application/json): depth limit"),
    Case("NUL bytes after the JSON", "digits", instances([digits_row()]) + NUL_BYTES, JSON, 400, "not valid JSON"),
    Case("huge integer", "digits", b'{"instances": [[' + b"9" * 5000 + b"]]}", JSON, 400, "not valid JSON"),
    # -- content types
    # Forms and multipart never reach TorchServe's frontend: the front door refuses them (docs/front-door.md).
    Case(
        "form-encoded text (curl's default)",
        "minilm",
        b"a sentence",
        FORM,
        415,
        "not accepted by lane minilm: send one of application/json, application/*+json, application/x-npy, text/*",
    ),
    Case(
        "multipart without a data part",
        "digits",
        MULTIPART_FILE,
        MULTIPART,
        415,
        "(a form or multipart body is never read)",
    ),
    Case("text to the image model", "digits", b"a sentence", TEXT, 415, "not accepted by lane digits: send one of"),
    Case("image to the text model", "minilm", png_header(8, 8), PNG, 415, "not accepted by lane minilm: send one of"),
    Case("no content type, not an image", "digits", NOT_AN_IMAGE, None, 400, "not a readable image"),
    # -- digits rows: count, shape, type, value
    Case(
        "63 values",
        "digits",
        instances([[1] * 63]),
        JSON,
        400,
        "instances[0]: expected 64 values in 0..16 (or an 8x8 list), got 63",
    ),
    Case("8x7 grid", "digits", instances([[[0] * 7] * 8]), JSON, 400, "instances[0]: expected an 8x8 list, got rows of lengths"),
    Case("row of wrong type", "digits", instances([digits_row(), "7"]), JSON, 400, "instances[1]: expected 64 numbers"),
    Case(
        "value of wrong type",
        "digits",
        instances([digits_row("3")]),
        JSON,
        400,
        "instances[0]: expected 64 values in 0..16, got '3'",
    ),
    Case("boolean value", "digits", instances([digits_row(True)]), JSON, 400, "got True"),
    # The worker hands the handler the bytes (no Python json, which accepts NaN): orjson refuses them as JSON does.
    Case("NaN", "digits", NAN_JSON, JSON, 400, "body is not valid JSON (Content-Type application/json): unexpected character"),
    Case(
        "Infinity",
        "digits",
        INFINITY_JSON,
        JSON,
        400,
        "body is not valid JSON (Content-Type application/json): number is infinity",
    ),
    Case("value over 16", "digits", instances([digits_row(17)]), JSON, 400, "expected 64 values in 0..16, got 17"),
    Case("negative value", "digits", instances([digits_row(-1)]), JSON, 400, "expected 64 values in 0..16, got -1"),
    Case("b64 not base64", "digits", instances([{"b64": "!!"}]), JSON, 400, "instances[0]: b64 is not valid base64"),
    Case("b64 with another key", "digits", instances([{"b64": "", "x": 1}]), JSON, 400, 'expected {"b64"'),
    # -- images
    Case("truncated PNG", "digits", truncated_png(), PNG, 400, "not a readable image (OSError: image file is truncated)"),
    Case("corrupt image", "digits", NOT_AN_IMAGE, PNG, 400, "not a readable image: the format is not one of PNG"),
    Case("zero-size PNG", "digits", png_header(0, 8), PNG, 400, "not a readable image"),
    Case("NUL bytes as an image", "digits", NUL_BYTES, "application/octet-stream", 400, "not a readable image"),
    Case("huge-pixel PNG", "digits", png_header(60000, 60000), PNG, 413, "image is 3600000000 pixels, over the limit of 1048576"),
    Case("PNG one row over the pixel limit", "digits", png_header(1024, 1025), PNG, 413, "image is 1024x1025 = 1049600 pixels"),
    # -- text
    Case("text not UTF-8", "minilm", NOT_UTF8, TEXT, 400, "body must be UTF-8 text"),
    Case("text over the byte limit", "minilm", b"x" * 65537, TEXT, 413, "text is 65537 bytes, over the limit of 65536 bytes"),
    Case("instance over the byte limit", "minilm", instances(["x" * 65537]), JSON, 413, "instances[0]: text is 65537 bytes"),
    Case("instance not a string", "minilm", instances(["fine", 7]), JSON, 400, "instances[1]: expected a string, got int"),
    Case(
        "lone surrogate",
        "minilm",
        LONE_SURROGATE_JSON,
        JSON,
        400,
        "body is not valid JSON (Content-Type application/json): no low surrogate",
    ),
    # -- rows per request
    Case("too many rows for digits", "digits", rows(1025), JSON, 413, "lane digits takes at most 1024 rows per request"),
    Case("too many rows for minilm", "minilm", rows(33), JSON, 413, "send it to lane minilm-bulk (up to 1024 rows per request)"),
    Case("too many rows for minilm-bulk", "minilm-bulk", rows(1025), JSON, 413, "split it into requests of at most 1024 rows"),
    Case("too many rows for digits-bulk", "digits-bulk", rows(200_001), JSON, 413, "at most 200000 rows per request"),
    # -- answered by TorchServe's frontend before the handler
    Case("body over max_request_size", "digits", OVER_MAX_REQUEST_SIZE, PNG, 413, "2097152 bytes, the limit of lane digits"),
    Case("unknown model", "nope", b"x", PNG, 404, "no such route: this API serves /ping and /predictions/<lane>"),
    # A multipart part without a name made the frontend's form decoder fail (a 500); the front door refuses it first.
    Case("multipart part without a name", "digits", b"--x\r\n\r\n--x--\r\n", MULTIPART, 415, "never read"),
]


def send(server, case: Case) -> requests.Response:
    endpoints = server.endpoints
    body = sent_body(server, case.body)
    headers = {**endpoints.auth("inference"), **({"Content-Type": case.media} if case.media is not None else {})}
    return requests.request(case.method, endpoints.prediction_url(case.lane), data=body, headers=headers, timeout=60)


def test_the_table_has_thirty_distinct_cases():
    assert len({case.name for case in CASES}) == len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_malformed_request_gets_its_status_naming_the_problem_and_no_worker_restarts(servers, case):
    server, watched = server_and_watched_lane(servers, case.lane)
    before = worker_pids(server.endpoints, watched)
    reply = send(server, case)
    assert reply.status_code == case.code, reply.text[:300]
    message = reply.json()["message"] if reply.content else ""
    assert case.message in message
    assert worker_pids(server.endpoints, watched) == before
