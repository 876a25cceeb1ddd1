"""The load generators and the peers against real servers: wrk and k6 on the digits lane, the peers answering
as the lane does (Flask, LitServe and BentoML here; Ray Serve and PyTriton, slower to start, in `make test-slow`).
Short runs: these check the harness works, `make bench` measures."""

from __future__ import annotations

import socket

import orjson
import pytest
import requests

from scripts.bench import loadgen, rivals
from scripts.bench.peers.roster import peer
from scripts.bench.stream import request_body
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


@pytest.mark.parametrize(
    "key",
    [
        "flask",
        "litserve",
        "bentoml",
        pytest.param("ray", marks=pytest.mark.slow),
        pytest.param("pytriton", marks=pytest.mark.slow),
    ],
)
def test_the_peers_answer_as_the_lane_does(key, digits_server):
    subject = peer(key)
    body = request_body("digits")
    endpoints = digits_server.endpoints
    expected = requests.post(
        endpoints.prediction_url("digits"), data=body, headers={**endpoints.auth("inference"), "Content-Type": JSON}
    ).json()
    with subject.start(MODEL_STORE / "digits.mar", free_port(), "digits", subject.settings_for("digits")) as url:
        reply = requests.post(url, data=subject.wrap(body), headers={"Content-Type": JSON}, timeout=60)
        wrong = requests.post(url, data=subject.wrap(request_body("minilm")), headers={"Content-Type": JSON}, timeout=60)
    assert reply.status_code == 200
    answer = subject.unwrap(orjson.loads(reply.content))
    assert rivals.same_answer("digits", expected, answer) is None
    assert answer["predictions"][0]["label"] == expected["predictions"][0]["label"]
    # A sentence is not a digits row: whatever the peer's status, its answer is not a prediction of the lane's.
    assert rivals.same_answer("digits", expected, subject.unwrap(_json(wrong))) is not None


def _json(reply: requests.Response):
    try:
        return orjson.loads(reply.content)
    except orjson.JSONDecodeError:
        return reply.text


@pytest.mark.slow
def test_the_ray_peer_moves_to_another_port_when_its_own_is_taken():
    # Ray's own processes take random ports before its proxy binds; here the port is taken on purpose.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    subject = peer("ray")
    try:
        with subject.start(MODEL_STORE / "digits.mar", port, "digits", subject.settings_for("digits")) as url:
            reply = requests.post(url, data=subject.wrap(request_body("digits")), headers={"Content-Type": JSON}, timeout=60)
    finally:
        taken.close()
    assert f":{port}/" not in url and reply.status_code == 200
