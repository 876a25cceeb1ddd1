"""The benchmark's pieces that need no server: the lanes it serves, the bodies it sends, how it judges targets."""

from __future__ import annotations

import base64
import json

import orjson
import pytest
import requests

from models import registry
from scripts.bench.pipeline import cpu_limit
from scripts.bench.stream import Target, check_answer, lanes_config, request_body
from scripts.errors import ScriptError
from scripts.server.config import LaneSettings


def test_one_torchserve_serves_the_lane_batch_size_1_and_both_floors_with_the_same_workers():
    config = lanes_config("digits", LaneSettings(batch_size=32, max_batch_delay=2, response_timeout=30, workers=2))
    assert config["load_models"] == "digits=digits.mar,digits-b1=digits.mar,noop=noop.mar,noop-b1=noop.mar"
    lanes = {name: versions["1.0"] for name, versions in json.loads(config["models"]).items()}
    assert {name: lane["batchSize"] for name, lane in lanes.items()} == {"digits": 32, "digits-b1": 1, "noop": 32, "noop-b1": 1}
    assert {(lane["minWorkers"], lane["maxWorkers"], lane["maxBatchDelay"]) for lane in lanes.values()} == {(2, 2, 2)}


def test_the_bodies_are_one_row_of_each_model_the_sample_its_folder_names():
    digits = orjson.loads(request_body("digits"))["instances"]
    assert len(digits) == 1 and len(digits[0]) == 64 and all(0 <= value <= 16 for value in digits[0])
    minilm = registry.model("minilm")
    assert orjson.loads(request_body("minilm"))["instances"] == [minilm.samples().instances[minilm.bench["request"]]]
    (image,) = orjson.loads(request_body("efficientnet_lite0"))["instances"]
    assert set(image) == {"b64"} and base64.b64decode(image["b64"])[:3] == b"\xff\xd8\xff"  # a JPEG
    with pytest.raises(ScriptError, match="no benchmark body for model 'x'"):
        request_body("x")


def answer(status: int, body: dict) -> requests.Response:
    reply = requests.Response()
    reply.status_code, reply._content = status, orjson.dumps(body)
    return reply


def test_a_system_whose_answer_breaks_the_contract_is_refused_before_it_is_timed():
    for model in registry.models():  # the body's own sample answer passes
        found = registry.model(model)
        check_answer(model, answer(200, {"predictions": [found.samples().answers[found.bench["request"]]]}), "Flask")
    with pytest.raises(ScriptError, match="LitServe answered HTTP 200"):
        check_answer("digits", answer(200, {"label": 1}), "LitServe")
    with pytest.raises(ScriptError, match="Flask answered HTTP 500"):
        check_answer("minilm", answer(500, {"error": "x"}), "Flask")
    wrong = {"top_k": [{"index": 1, "label": "goldfish", "probability": 0.9}] * 5}
    with pytest.raises(ScriptError, match="not the efficientnet_lite0 sample's answer: top_k"):
        check_answer("efficientnet_lite0", answer(200, {"predictions": [wrong]}), "Ray Serve")


def test_targets_say_met_or_missed_with_the_measured_value():
    assert Target("lane / Flask", 2.5, 2.0).row() == "| lane / Flask | 2.50x | >= 2x | met |"
    assert Target("p99", 61.0, 50, higher_is_better=False, unit=" ms").row() == "| p99 | 61.00 ms | <= 50 ms | **missed** |"


def test_the_cpu_limit_is_the_cores_over_the_floor_and_pipeline_cost():
    assert cpu_limit(2, floor_cpu_ms=0.19, pipeline_cpu_ms=0.08) == pytest.approx(2000 / 0.27)
