"""The adapter driven the way TorchServe drives it: a real ts Context, RequestProcessors and metrics cache."""

from __future__ import annotations

import importlib
import logging
import os
import socket
import struct
from pathlib import Path

import orjson
import pytest
import torch
import yaml
from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.protocol import otf_message_handler
from ts.utils.util import list_classes_from_module

from models.digits.samples import grid_png, held_out
from scripts.layout import ROOT

MODULE = importlib.import_module("handlers.torchserve.torchserve_handler")


def make_context(
    model_dir: Path, requests: int, metrics_config: Path | None = None, media: list[str] | None = None, **yaml_sections
) -> Context:
    """A Context for a batch of `requests`; `media`: each request body's content type, as the frontend passes it."""
    metrics = MetricsCacheYamlImpl(config_file_path=str(metrics_config or ROOT / "monitoring" / "metrics.yaml"))
    metrics.initialize_cache()
    config = {**yaml.safe_load((ROOT / "models" / "digits" / "model-config.yaml").read_text()), **yaml_sections}
    context = Context(
        "digits",
        str(model_dir),
        {"model": {"modelName": "digits"}},
        16,
        None,
        "0.12.0",
        metrics=metrics,
        model_yaml_config=config,
    )
    media = media or [""] * requests
    context.request_processor = [RequestProcessor({"body": {"content-type": media[index]}}) for index in range(requests)]
    context.request_ids = {index: f"request-{index}" for index in range(requests)}
    metrics.request_ids = context.request_ids
    return context


@pytest.fixture(scope="module")
def handler(digits_model_dir):
    [handler_class] = list_classes_from_module(MODULE)  # TorchServe needs exactly one class in the entry module
    handler = handler_class()
    threads = torch.get_num_threads()
    handler.initialize(make_context(digits_model_dir, 0))
    yield handler
    torch.set_num_threads(threads)  # initialize() limits this process's threads as it would a worker's


def test_initialize_limits_the_workers_torch_threads_to_the_archives_setting(handler):
    assert handler.core.settings.threads_for("digits") == 1  # make_context serves the digits (stream) lane
    assert torch.get_num_threads() == 1


def test_the_worker_hands_every_body_over_as_bytes_once_the_handler_is_initialized(handler):
    """TorchServe's own worker code reading one request frame from a real socket: after initialize(),
    an application/json or text/* body is not parsed or decoded, so the handler can check its size first."""
    assert os.environ["TS_DECODE_INPUT_REQUEST"] == "false"
    for media, body in (("application/json", b'{"instances": [{}, {}]}'), ("text/plain", "é".encode())):
        frame = b"".join(struct.pack("!i", len(part)) + part for part in (b"body", media.encode(), body))
        ours, theirs = socket.socketpair()
        with ours, theirs:
            ours.sendall(frame)
            value = otf_message_handler._retrieve_input_data(theirs)
        # Decoding on, these would be a dict and a str.
        assert isinstance(value["value"], bytearray) and bytes(value["value"]) == body


def test_the_worker_pid_is_answered_only_to_a_request_that_asks(handler, digits_model_dir):
    context = make_context(digits_model_dir, 2, media=["application/json"] * 2)
    context.request_processor[1] = RequestProcessor({"body": {"content-type": "application/json"}, "x-report-worker-pid": "1"})
    body = b'{"instances": [' + b",".join([b"0"] * 64).join([b"[", b"]"]) + b"]}"
    handler.handle([{"body": bytearray(body)}, {"body": bytearray(body)}], context)
    assert [context.get_response_status(i)[0] for i in range(2)] == [200, 200]
    assert "X-Worker-Pid" not in context.get_response_headers(0)
    assert context.get_response_headers(1)["X-Worker-Pid"] == str(os.getpid())
    assert context.get_response_headers(0)["X-Batch-Requests"] == "2"


def test_one_response_per_request_in_order_with_per_request_status(handler, digits_model_dir):
    grids, labels = held_out(3)
    data = [
        {"body": bytearray(grid_png(grids[0]))},
        {"body": {"instances": [grids[1].tolist(), [0] * 10]}},
        {"body": {"instances": [grids[1].tolist(), grids[2].tolist()]}},
        {"data": b""},
    ]
    context = make_context(digits_model_dir, len(data))
    bodies = [orjson.loads(body) for body in handler.handle(data, context)]
    assert [context.get_response_status(i)[0] for i in range(4)] == [200, 400, 200, 400]
    assert bodies[0]["label"] == labels[0]
    assert bodies[1]["message"] == "instances[1]: expected 64 values in 0..16 (or an 8x8 list), got 10"
    assert context.get_response_status(1)[1] == bodies[1]["message"]
    assert [p["label"] for p in bodies[2]["predictions"]] == labels[1:].tolist()
    assert bodies[3]["code"] == 400 and "empty request body" in bodies[3]["message"]
    assert all(context.get_response_content_type(i) == "application/json" for i in range(4))
    assert context.get_response_headers(0)["X-Batch-Requests"] == "4"


def test_each_request_is_read_by_its_content_type_and_checked_against_the_lanes_limits(handler, digits_model_dir):
    grids, labels = held_out(2)
    requests = [
        # application/json that does not parse: TorchServe's worker hands over the bytes
        ({"body": bytearray(b'{"instances": [')}, "application/json"),
        ({"body": {"instances": [[0] * 64] * 1025}}, "application/json"),  # one row over the digits lane's 1024
        ({"body": "a sentence"}, "text/plain"),  # a raw body of a type the digits task does not read
        ({"body": {"instances": [grids[0].tolist()], "extra": 1}}, "application/json"),
        ({"body": {"instances": [[1] * 63 + ["é\n"]]}}, "application/json"),  # the message quotes a non-ASCII value
        ({"body": bytearray(grid_png(grids[1]))}, "image/png"),
    ]
    context = make_context(digits_model_dir, len(requests), media=[media for _, media in requests])
    bodies = [orjson.loads(body) for body in handler.handle([request for request, _ in requests], context)]
    assert [context.get_response_status(i)[0] for i in range(len(requests))] == [400, 413, 415, 400, 400, 200]
    assert bodies[0]["message"].startswith("body is not valid JSON (Content-Type application/json): unexpected end of data")
    assert bodies[1]["message"] == (
        "request has 1025 rows; lane digits takes at most 1024 rows per request (handler.max_request_rows): "
        "send it to lane digits-bulk (up to 200000 rows per request)"
    )
    assert bodies[2]["message"].startswith("Content-Type text/plain is not read here: send one item as image/*")
    assert bodies[3]["message"] == "unknown field(s) ['extra'] in the JSON body: only 'instances' is read"
    # The JSON body keeps the message as it is; the HTTP reason phrase is one line of ASCII.
    assert bodies[4]["message"] == "instances[0]: expected 64 values in 0..16, got 'é\\n'"
    assert context.get_response_status(4)[1] == "instances[0]: expected 64 values in 0..16, got '\\xe9\\n'"
    assert bodies[5]["label"] == labels[1]


def test_batch_metrics_are_emitted(handler, digits_model_dir, caplog):
    grids, _ = held_out(5)
    context = make_context(digits_model_dir, 2)
    with caplog.at_level(logging.INFO, logger="ts.metrics.caching_metric"):
        handler.handle([{"body": {"instances": [g.tolist() for g in grids]}}, {"body": bytearray(grid_png(grids[0]))}], context)
    # The worker prints metric lines that the frontend turns into Prometheus series: name.unit:value|#dims
    # (a batch's lines arrive as one record: handlers/torchserve/metrics.py)
    lines = {
        line.removeprefix("[METRICS]").split(":")[0]: line.split(":")[1].split("|")[0]
        for message in caplog.messages
        for line in message.splitlines()
    }
    assert lines["HandlerBatchRequests.Count"] == "2"
    assert lines["HandlerBatchRows.Count"] == "6"
    assert 0 < float(lines["HandlerLatencySeconds.Seconds"]) < 60


def test_initialize_rejects_a_config_without_handler_section(digits_model_dir):
    context = make_context(digits_model_dir, 0)
    context.model_yaml_config = {"minWorkers": 1}
    with pytest.raises(ValueError, match="no 'handler:' section"):
        MODULE.UnifiedHandler().initialize(context)
