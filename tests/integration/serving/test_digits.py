"""A real TorchServe with digits on both lanes: payloads, labels, tokens, batching, per-request errors."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
import requests

from models.digits.samples import grid_png, held_out, scanned_png
from scripts.clients.load import send_concurrently
from scripts.clients.rest import predict
from scripts.server.config import ServerConfig
from scripts.server.front_door import bulk_admitted

LANES = ["digits", "digits-bulk"]


def post_json(endpoints, lane, body) -> requests.Response:
    return predict(endpoints, lane, orjson.dumps(body), "application/json")


@pytest.mark.parametrize("lane", LANES)
def test_png_bodies_get_the_held_out_label(digits_server, lane):
    grids, labels = held_out(10)
    for grid, label in zip(grids, labels, strict=True):
        reply = predict(digits_server.endpoints, lane, grid_png(grid), "image/png")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["label"] == label
        assert sum(body["scores"]) == pytest.approx(1.0, abs=1e-5)


def test_a_larger_colour_scan_with_dark_ink_is_classified(digits_server):
    grids, labels = held_out(10)
    answers = [predict(digits_server.endpoints, "digits", scanned_png(g), "image/png").json()["label"] for g in grids]
    assert np.mean(np.array(answers) == labels) >= 0.9


@pytest.mark.parametrize("lane", LANES)
def test_json_instances_answer_every_row_in_order_with_held_out_accuracy(digits_server, lane):
    grids, labels = held_out()
    reply = post_json(digits_server.endpoints, lane, {"instances": [g.astype(int).flatten().tolist() for g in grids]})
    assert reply.status_code == 200
    predicted = [p["label"] for p in reply.json()["predictions"]]
    assert len(predicted) == len(labels)
    assert np.mean(np.array(predicted) == labels) >= 0.97


def test_a_request_without_a_token_is_refused(digits_server):
    grids, _ = held_out(1)
    url = digits_server.endpoints.prediction_url("digits")
    reply = requests.post(url, data=grid_png(grids[0]), headers={"Content-Type": "image/png"}, timeout=30)
    assert reply.status_code == 400 and reply.json()["type"] == "InvalidKeyException"
    wrong = requests.post(
        url, data=grid_png(grids[0]), headers={"Content-Type": "image/png", "Authorization": "Bearer nope"}, timeout=30
    )
    assert wrong.status_code == 400 and "Token Authorization failed" in wrong.json()["message"]


def send_together(endpoints, lane, bodies: list[bytes]) -> list[requests.Response]:
    """Every body in flight at once (one client each), so TorchServe can batch them."""
    kinds = ["image/png" if body[:4] == b"\x89PNG" else "application/json" for body in bodies]
    return [answer.reply for answer in send_concurrently(endpoints, lane, bodies, kinds, clients=len(bodies))]


@pytest.mark.parametrize("lane", LANES)
def test_concurrent_requests_are_batched_and_a_bad_one_fails_alone(digits_server, lane):
    # A bulk lane takes as many requests at once as the front door admits (its workers' batches and a job's chunks).
    count = 12 if not lane.endswith("-bulk") else bulk_admitted(ServerConfig.read(digits_server.server.config), lane) - 1
    grids, labels = held_out(count)
    bad = orjson.dumps({"instances": [[1] * 63]})
    half = count // 2
    bodies = [grid_png(g) for g in grids[:half]] + [bad] + [grid_png(g) for g in grids[half:]]
    for _ in range(10):  # batching depends on arrival within maxBatchDelay: retry a few rounds
        replies = send_together(digits_server.endpoints, lane, bodies)
        bad_reply = replies[half]
        assert bad_reply.status_code == 400
        assert bad_reply.json()["message"] == "instances[0]: expected 64 values in 0..16 (or an 8x8 list), got 63"
        good = replies[:half] + replies[half + 1 :]
        assert [r.status_code for r in good] == [200] * count
        assert [r.json()["label"] for r in good] == labels.tolist()
        if int(bad_reply.headers["X-Batch-Requests"]) > 1:
            break
    else:
        pytest.fail("in 10 rounds the bad request never shared a batch with good ones")


def prometheus_value(text: str, series: str, lane: str) -> float:
    """The sum of `series` over the samples of `lane` (handler metrics are labelled model and lane)."""
    prefix = f'{series}{{model="digits",lane="{lane}",'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_handler_metrics_reach_prometheus(digits_server):
    grids, _ = held_out(4)
    url = f"{digits_server.endpoints.metrics}/metrics"
    before = prometheus_value(requests.get(url, timeout=30).text, "HandlerBatchRows_sum", "digits-bulk")
    assert post_json(digits_server.endpoints, "digits-bulk", {"instances": [g.tolist() for g in grids]}).status_code == 200
    # The frontend reads the worker's metric lines on its own thread: on a busy machine a scrape can come first.
    deadline = time.monotonic() + 10
    while (
        rows := prometheus_value(text := requests.get(url, timeout=30).text, "HandlerBatchRows_sum", "digits-bulk")
    ) < before + 4:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert rows == before + 4
    # Latency in seconds, so Prometheus' default buckets (5 ms .. 10 s) give usable percentiles.
    assert prometheus_value(text, "HandlerLatencySeconds_count", "digits-bulk") >= 1
    assert prometheus_value(text, "HandlerLatencySeconds_bucket", "digits-bulk") > 0


def test_each_lane_runs_with_its_own_batching(digits_server):
    endpoints = digits_server.endpoints
    described = {}
    for lane in LANES:
        reply = requests.get(f"{endpoints.management}/models/{lane}", headers=endpoints.auth("management"), timeout=30)
        [model] = reply.json()
        described[lane] = (model["batchSize"], model["maxBatchDelay"], model["responseTimeout"], len(model["workers"]))
    # TorchServe applies the archive's responseTimeout to both lanes: a wall-clock backstop of two hours. Each lane's own
    # limit is the handler's: wall-clock on the stream lane, the seconds its worker ran on the bulk lane.
    assert described == {"digits": (32, 1, 7200, 2), "digits-bulk": (4, 50, 7200, 1)}
    log = (digits_server.workdir / "logs" / "model_log.log").read_text(errors="replace")
    assert "model digits-bulk: task digit_classification on cpu" in log
    assert "response_timeout_s=300 (run time)" in log
    assert "response_timeout_s=20 (wall-clock time)" in log
