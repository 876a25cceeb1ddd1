"""Malformed requests over gRPC against a real TorchServe, one table: each gets an error naming the problem,
and the lane's workers are the same processes afterwards (none crashed or restarted).

What TorchServe 0.12 really does over gRPC (docs/hardening.md, "Bad input"): it drops the status the handler
sets, so a request the handler refuses is a call that succeeds (status OK) whose body is the handler's error
JSON, {"code": 4xx, "type", "message"}; scripts/clients/grpc_client.py raises PredictionError with that code.
Only what the frontend refuses itself is a gRPC error status: an unknown model (INTERNAL, where REST says
404) and a message over max_request_size (the stream is reset: CANCELLED). gRPC has no content type: a body
whose first character is "{" is JSON, any other is one raw item.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from scripts.clients.grpc_client import GrpcClient, error_in, rpc_error
from scripts.clients.grpc_stubs import inference_pb2
from tests.integration.serving.bad_input import OVER_MAX_REQUEST_SIZE, sent_body, server_and_watched_lane, worker_pids
from tests.malformed import (
    DEEP_JSON,
    INFINITY_JSON,
    LONE_SURROGATE_JSON,
    NAN_JSON,
    NOT_AN_IMAGE,
    NOT_UTF8,
    NUL_BYTES,
    digits_row,
    instances,
    png_header,
    rows,
    truncated_png,
)


@dataclass(frozen=True)
class Case:
    name: str
    lane: str
    input: dict[str, bytes]  # PredictionsRequest.input: the handler reads "body" (or "data")
    code: int | str  # the handler's 4xx in the error body of an OK call, or the gRPC status TorchServe gives
    message: str  # a part of the error's message


def body(data: bytes) -> dict[str, bytes]:
    return {"body": data}


CASES = [
    # -- the request as a whole
    Case("no input at all", "digits", {}, 400, 'the request has no "body" or "data" input (got: none)'),
    Case("input under another name", "digits", {"image": png_header(8, 8)}, 400, 'no "body" or "data" input (got: \'image\')'),
    Case("empty body", "digits", body(b""), 400, "empty request body"),
    Case("empty text body", "minilm", body(b""), 400, "empty request body"),
    Case("invalid JSON", "digits", body(b'{"instances": [[1, 2'), 400, 'not valid JSON (it starts with "{")'),
    Case("text that starts like JSON", "minilm", body(b"{curly} braces"), 400, 'not valid JSON (it starts with "{")'),
    Case("JSON without instances", "minilm", body(b'{"text": "a"}'), 400, "'instances' list, got keys ['text']"),
    Case("unknown field", "digits", body(b'{"instances": [[0]], "parameters": {}}'), 400, "unknown field(s) ['parameters']"),
    Case("empty instances", "digits", body(instances([])), 400, "'instances' must be a non-empty JSON list"),
    Case("instances not a list", "minilm", body(b'{"instances": "a"}'), 400, "'instances' must be a non-empty JSON list"),
    Case("deeply nested JSON", "digits", body(DEEP_JSON), 400, "not valid JSON"),
    Case("NUL bytes after the JSON", "digits", body(instances([digits_row()]) + NUL_BYTES), 400, "not valid JSON"),
    Case("huge integer", "digits", body(b'{"instances": [[' + b"9" * 5000 + b"]]}"), 400, "not valid JSON"),
    Case("NaN", "digits", body(NAN_JSON), 400, "not valid JSON"),
    Case("Infinity", "digits", body(INFINITY_JSON), 400, "not valid JSON"),
    # -- digits rows: count, shape, type, value
    Case(
        "63 values",
        "digits",
        body(instances([[1] * 63])),
        400,
        "instances[0]: expected 64 values in 0..16 (or an 8x8 list), got 63",
    ),
    Case("8x7 grid", "digits", body(instances([[[0] * 7] * 8])), 400, "instances[0]: expected an 8x8 list, got rows of lengths"),
    Case("row of wrong type", "digits", body(instances([digits_row(), "7"])), 400, "instances[1]: expected 64 numbers"),
    Case("value of wrong type", "digits", body(instances([digits_row("3")])), 400, "expected 64 values in 0..16, got '3'"),
    Case("boolean value", "digits", body(instances([digits_row(False)])), 400, "got False"),
    Case("value over 16", "digits", body(instances([digits_row(16.5)])), 400, "expected 64 values in 0..16, got 16.5"),
    Case("negative value", "digits", body(instances([digits_row(-0.1)])), 400, "expected 64 values in 0..16, got -0.1"),
    Case("b64 not base64", "digits", body(instances([{"b64": "@@"}])), 400, "instances[0]: b64 is not valid base64"),
    Case("b64 with another key", "digits", body(instances([{"png": ""}])), 400, 'expected {"b64"'),
    # -- images
    Case("not an image", "digits", body(NOT_AN_IMAGE), 400, "not a readable image: the format is not one of PNG"),
    Case("truncated PNG", "digits", body(truncated_png()), 400, "not a readable image (OSError: image file is truncated)"),
    Case("zero-size PNG", "digits", body(png_header(8, 0)), 400, "not a readable image"),
    Case("NUL bytes as an image", "digits", body(NUL_BYTES), 400, "not a readable image"),
    Case(
        "huge-pixel PNG",
        "digits",
        body(png_header(100000, 100000)),
        413,
        "image is 10000000000 pixels, over the limit of 1048576",
    ),
    Case(
        "PNG one column over the pixel limit", "digits", body(png_header(1025, 1024)), 413, "image is 1025x1024 = 1049600 pixels"
    ),
    # -- text
    Case("text not UTF-8", "minilm", body(NOT_UTF8), 400, "body must be UTF-8 text"),
    Case("text over the byte limit", "minilm", body("é".encode() * 40000), 413, "text is 80000 bytes, over the limit of 65536"),
    Case("instance over the byte limit", "minilm", body(instances(["y" * 70000])), 413, "instances[0]: text is 70000 bytes"),
    Case("instance not a string", "minilm", body(instances([["a"]])), 400, "instances[0]: expected a string, got list"),
    Case("lone surrogate", "minilm", body(LONE_SURROGATE_JSON), 400, "not valid JSON"),
    # -- rows per request
    Case(
        "too many rows for digits", "digits", body(rows(1025)), 413, "send it to lane digits-bulk (up to 200000 rows per request)"
    ),
    Case("too many rows for minilm", "minilm", body(rows(33)), 413, "lane minilm takes at most 32 rows per request"),
    Case("too many rows for minilm-bulk", "minilm-bulk", body(rows(1025)), 413, "split it into requests of at most 1024 rows"),
    # -- answered by the front door (the body) and TorchServe's frontend (the model) before the handler
    Case(
        "body over max_request_size",
        "digits",
        body(OVER_MAX_REQUEST_SIZE),
        "UNAVAILABLE",
        "a message over 67108864 bytes is refused",
    ),
    Case("unknown model", "nope", body(b"x"), "INTERNAL", "Model not found: nope"),
]


def call(server, case: Case) -> tuple[int | str, str]:
    """(code, message) of the case's refusal: the handler's error body in an OK reply, or the call's status."""
    inputs = dict(case.input)
    if "body" in inputs:
        inputs["body"] = sent_body(server, inputs["body"])
    with GrpcClient(server.endpoints) as client:
        request = inference_pb2.PredictionsRequest(model_name=case.lane, input=inputs)
        try:
            reply, status = client.stub.Predictions.with_call(request, metadata=client.metadata, timeout=60)
        except grpc.RpcError as error:
            return error.code().name, rpc_error(error).message
    assert status.code() == grpc.StatusCode.OK
    refusal = error_in(reply.prediction)
    assert refusal is not None, f"not refused: {reply.prediction[:200]!r}"
    return refusal.code, refusal.message


def test_the_table_has_thirty_distinct_cases():
    assert len({case.name for case in CASES}) == len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_malformed_request_gets_an_error_naming_the_problem_and_no_worker_restarts(servers, case):
    server, watched = server_and_watched_lane(servers, case.lane)
    before = worker_pids(server.endpoints, watched)
    code, message = call(server, case)
    assert code == case.code, message
    assert case.message in message
    assert worker_pids(server.endpoints, watched) == before
