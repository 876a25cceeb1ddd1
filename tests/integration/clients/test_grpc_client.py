"""The gRPC client against a real TorchServe: token in metadata, unary and streamed answers, errors raised."""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from models.digits.samples import grid_png, held_out
from scripts.clients.grpc_client import GrpcClient, PredictionError
from scripts.swap.management import ManagementApi
from scripts.swap.sequence_lane import SEQUENCE_CONFIG, add_sequence_lane


@pytest.fixture(scope="module")
def grpc_client(digits_server):
    with GrpcClient(digits_server.endpoints, timeout=60) as client:
        yield client


@pytest.mark.parametrize("lane", ["digits", "digits-bulk"])
def test_unary_predictions_give_the_held_out_labels(grpc_client, lane):
    grids, labels = held_out(10)
    results = [grpc_client.predict(lane, grid_png(grid)) for grid in grids]
    assert [result["label"] for result in results] == labels.tolist()
    assert all(sum(result["scores"]) == pytest.approx(1.0, abs=1e-5) for result in results)


def test_json_instances_over_grpc_answer_every_row(grpc_client):
    grids, labels = held_out(50)
    body = json.dumps({"instances": grids.tolist()}).encode()
    predictions = grpc_client.predict("digits", body, version="1.0")["predictions"]
    assert len(predictions) == 50
    assert sum(p["label"] == label for p, label in zip(predictions, labels, strict=True)) >= 48


def test_a_stream_answers_in_order(grpc_client):
    grids, labels = held_out(40)
    results = list(grpc_client.stream("digits", [grid_png(grid) for grid in grids], window=8))
    assert [result["label"] for result in results] == labels.tolist()


def test_a_refused_request_raises_with_the_handlers_message(grpc_client):
    with pytest.raises(PredictionError) as raised:
        grpc_client.predict("digits", b"these bytes are no image")
    assert (raised.value.code, raised.value.type) == (400, "InvalidInput")
    assert "not a readable image" in raised.value.message


def test_a_refused_row_in_a_stream_raises_when_its_turn_comes(grpc_client):
    grids, labels = held_out(3)
    bodies = [grid_png(grids[0]), json.dumps({"instances": [[1, 2, 3]]}).encode(), grid_png(grids[2])]
    stream = grpc_client.stream("digits", bodies, window=3)
    assert next(stream)["label"] == labels[0]
    with pytest.raises(PredictionError, match=r"instances\[0\]: .*64"):
        next(stream)


def test_a_bad_token_and_an_unknown_model_are_errors(digits_server, grpc_client):
    wrong = dataclasses.replace(digits_server.endpoints, key_file=digits_server.workdir / "wrong_keys.json")
    wrong.key_file.write_text(json.dumps({"inference": {"key": "nope"}, "management": {"key": "nope"}}))
    with GrpcClient(wrong) as client, pytest.raises(PredictionError) as raised:
        client.predict("digits", grid_png(held_out(1)[0][0]))
    assert raised.value.code == "PERMISSION_DENIED" and "Token Authorization failed" in raised.value.message
    with pytest.raises(PredictionError, match="Model not found: nope"):
        grpc_client.predict("nope", b"{}")
    with pytest.raises(PredictionError, match="version: 9.9 does not exist"):
        grpc_client.predict("digits", b"{}", version="9.9")


@pytest.fixture(scope="module")
def sequence_lane(digits_server):
    """digits-seq: the digits archive with sequence batching, registered on the session server for this module."""
    lane = add_sequence_lane(digits_server.endpoints, digits_server.model_store, "digits")
    yield lane
    api = ManagementApi(digits_server.endpoints)
    for state in api.versions(lane):
        api.unregister(lane, state.version)


def test_stream2_answers_every_item_in_order_like_the_stateless_lane(grpc_client, sequence_lane):
    grids, _ = held_out(60)
    bodies = [grid_png(grid) for grid in grids]
    expected = list(grpc_client.stream("digits", bodies))
    results = list(grpc_client.stream2(sequence_lane, bodies, window=8))
    assert [result["label"] for result in results] == [result["label"] for result in expected]
    assert [result["scores"] for result in results] == [pytest.approx(result["scores"], abs=1e-5) for result in expected]


def test_concurrent_streams_each_get_their_own_answers_in_order(grpc_client, sequence_lane):
    grids, _ = held_out(120)
    bodies = [grid_png(grid) for grid in grids]
    expected = [result["label"] for result in grpc_client.stream("digits", bodies)]
    slices = [slice(k * 30, (k + 1) * 30) for k in range(4)]
    with ThreadPoolExecutor(len(slices)) as pool:
        answers = list(pool.map(lambda part: [r["label"] for r in grpc_client.stream2(sequence_lane, bodies[part])], slices))
    assert answers == [expected[part] for part in slices]


def test_a_refused_item_raises_and_the_stream_goes_on(grpc_client, sequence_lane):
    grids, _ = held_out(3)
    expected = [grpc_client.predict("digits", grid_png(grid))["label"] for grid in grids]
    bodies = [
        grid_png(grids[0]),
        b"these bytes are no image",
        grid_png(grids[2]),
        json.dumps({"instances": [[1, 2, 3]]}).encode(),
        grid_png(grids[1]),
    ]
    with grpc_client.stream2(sequence_lane, bodies, window=2) as stream:
        assert next(stream)["label"] == expected[0]
        with pytest.raises(PredictionError) as raised:
            next(stream)
        assert (raised.value.code, raised.value.type) == (400, "InvalidInput") and "not a readable image" in raised.value.message
        assert next(stream)["label"] == expected[2]
        with pytest.raises(PredictionError, match=r"instances\[0\]: .*64"):
            next(stream)
        assert next(stream)["label"] == expected[1]
        assert list(stream) == []


def test_a_long_lived_stream_survives_an_idle_gap(grpc_client, sequence_lane):
    """TorchServe drops a sequence idle for sequenceMaxIdleMSec; the next message of the stream starts a new one."""
    grids, _ = held_out(2)
    expected = [grpc_client.predict("digits", grid_png(grid))["label"] for grid in grids]

    def slow_bodies():
        yield grid_png(grids[0])
        time.sleep(SEQUENCE_CONFIG["sequenceMaxIdleMSec"] / 1000 + 1)
        yield grid_png(grids[1])

    assert [result["label"] for result in grpc_client.stream2(sequence_lane, slow_bodies(), window=1)] == expected


def test_stream2_refuses_a_stateless_lane_and_an_unknown_model(grpc_client, sequence_lane, digits_server):
    grids, _ = held_out(2)
    with pytest.raises(PredictionError) as raised:
        list(grpc_client.stream2("digits", [grid_png(grid) for grid in grids]))
    # Usually the call dies at once (UNKNOWN, mapped to StreamNotSupported). Under load TorchServe 0.12
    # sometimes answers the first item and then refuses the next with an error status: either way the
    # stream fails instead of answering everything.
    if raised.value.type == "StreamNotSupported":
        assert "digits-seq" in raised.value.message
    else:
        assert raised.value.type == "GrpcError" and raised.value.message, raised.value
    # TorchServe may close the connection after refusing that stream (GOAWAY: "Stream ... in unexpected state"),
    # which fails a call already on it with UNAVAILABLE: ask on a channel of its own.
    with GrpcClient(digits_server.endpoints, timeout=60) as fresh, pytest.raises(PredictionError, match="Model not found: nope"):
        list(fresh.stream2("nope", [grid_png(grids[0])]))
