"""The load generators and the peers against real servers: wrk and k6 on the digits lane, Flask and LitServe
answering the lane's contract. Short runs: these check the harness works, `make bench` measures."""

from __future__ import annotations

import orjson
import pytest
import requests

from scripts.bench import loadgen
from scripts.bench.peers.flask_app import flask_peer
from scripts.bench.peers.litserve_app import litserve_peer
from scripts.bench.stream import check_answer, request_body
from scripts.layout import JSON, MODEL_STORE
from scripts.server.process import free_port


@pytest.fixture(scope="module")
def lane(digits_server) -> loadgen.Target:
    endpoints = digits_server.endpoints
    return loadgen.Target(endpoints.prediction_url("digits"), request_body("digits"), JSON, endpoints.token("inference"))


def test_wrk_closed_loop_reports_every_answer_and_ordered_percentiles(lane):
    result = loadgen.closed_loop(lane, connections=4, seconds=1)
    assert result.mode == "closed" and result.tool.startswith("wrk")
    assert result.requests > 20 and result.errors == 0
    assert 0 < result.p50_ms <= result.p95_ms <= result.p99_ms <= result.max_ms
    assert result.rps == pytest.approx(result.requests / result.seconds)  # no errors: every answer counts


def test_wrk_counts_refused_requests_as_errors(lane):
    result = loadgen.closed_loop(loadgen.Target(lane.url, lane.body, JSON, "not-the-token"), connections=2, seconds=1)
    assert result.requests > 0 and result.errors == result.requests and result.rps == 0


def test_k6_open_loop_offers_the_rate_it_was_asked_for(lane):
    result = loadgen.open_loop(lane, rate=50, seconds=2)
    assert result.mode == "open" and result.offered_rps == 50
    # 100 offered over 2 s; the shared 2 cores may delay a few starts (dropped) or the last answers.
    assert 70 <= result.requests <= 110 and result.errors == 0 and result.dropped <= 10
    assert 0 < result.p50_ms <= result.p99_ms


@pytest.mark.parametrize("peer", ["flask", "litserve"])
def test_the_peers_answer_as_the_lane_does(peer, digits_server):
    archive = MODEL_STORE / "digits.mar"
    body = request_body("digits")
    start = flask_peer(archive, free_port()) if peer == "flask" else litserve_peer(archive, free_port(), "digits", 32, 0.002)
    endpoints = digits_server.endpoints
    expected = requests.post(
        endpoints.prediction_url("digits"), data=body, headers={**endpoints.auth("inference"), "Content-Type": JSON}
    )
    with start as url:
        reply = requests.post(f"{url}/predictions/digits", data=body, headers={"Content-Type": JSON}, timeout=60)
    check_answer("digits", reply, peer)
    assert orjson.loads(reply.content)["predictions"][0]["label"] == expected.json()["predictions"][0]["label"]
