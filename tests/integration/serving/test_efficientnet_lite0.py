"""The ImageNet classifier through a real TorchServe behind its front door: both lanes, REST and gRPC, a batch job
over a folder of JPEGs, each answer against the eager reference (tests' own preprocessing, same weights): the same
top 5, probabilities within 1e-4 (fp32); bad images answered 4xx alone while the good ones beside them are answered."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from PIL import Image

from models.efficientnet_lite0.samples import PHOTOGRAPHS, photograph_bytes, reference_top_k
from scripts.clients.grpc_client import GrpcClient
from scripts.clients.rest import predict
from scripts.jobs.batch_job import EXIT_OK, EXIT_ROW_ERRORS, main
from scripts.layout import JSON
from tests.batch_jobs import job_args, on_server
from tests.malformed import png_header

STREAM, BULK = "efficientnet_lite0", "efficientnet_lite0-bulk"
TOLERANCE = 1e-4
MEDIA = {".png": "image/png", ".jpg": "image/jpeg"}


@pytest.fixture(scope="module")
def classifier(efficientnet_lite0_server):
    return efficientnet_lite0_server  # the session's (tests/integration/conftest.py), which make fuzz's test shares


@pytest.fixture(scope="module")
def photographs() -> dict[str, bytes]:
    return {name: photograph_bytes(name) for name in PHOTOGRAPHS}


@pytest.fixture(scope="module")
def reference(photographs) -> dict[str, list]:
    return dict(zip(photographs, reference_top_k(list(photographs.values())), strict=True))


def assert_agrees(answer: dict, expected: list) -> None:
    served = answer["top_k"]
    assert [guess["index"] for guess in served] == [guess.index for guess in expected]
    assert [guess["label"] for guess in served] == [guess.label for guess in expected]
    assert max(abs(s["probability"] - e.probability) for s, e in zip(served, expected, strict=True)) <= TOLERANCE


def b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode("ascii")}


def test_each_photograph_as_a_raw_body_on_the_stream_lane_gets_the_references_top_5(classifier, photographs, reference):
    for name, data in photographs.items():
        reply = predict(classifier.endpoints, STREAM, data, MEDIA[name[name.rindex(".") :]], timeout=60)
        assert reply.status_code == 200, reply.text
        assert_agrees(reply.json(), reference[name])
    assert reference["chelsea.png"][0].label in {"tabby", "tiger cat", "Egyptian cat"}


def test_all_photographs_in_one_bulk_request_are_answered_in_order(classifier, photographs, reference):
    body = orjson.dumps({"instances": [b64(data) for data in photographs.values()]})
    reply = predict(classifier.endpoints, BULK, body, JSON, timeout=120)
    assert reply.status_code == 200, reply.text
    for name, answer in zip(photographs, reply.json()["predictions"], strict=True):
        assert_agrees(answer, reference[name])


def test_grpc_answers_as_rest_does(classifier, photographs, reference):
    with GrpcClient(classifier.endpoints, timeout=60) as client:
        for name, data in photographs.items():
            assert_agrees(client.predict(STREAM, data), reference[name])
        answer = client.predict(BULK, orjson.dumps({"instances": [b64(photographs["coffee.png"])]}))
    assert_agrees(answer["predictions"][0], reference["coffee.png"])


def gif(frames: int) -> bytes:
    images = [Image.new("P", (4, 4), i % 256) for i in range(frames)]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:])
    return buffer.getvalue()


def test_bad_images_are_answered_alone_while_good_ones_beside_them_are_answered(classifier, photographs, reference):
    rocket = photographs["rocket.jpg"]
    bad = {
        "truncated JPEG": (rocket[: len(rocket) // 2], "image/jpeg", 400, "truncated"),
        "30000x30000 header": (png_header(30_000, 30_000), "image/png", 413, "pixels"),
        "1000-frame GIF": (gif(1000), "image/gif", 415, "GIF"),
        "text": (b"not an image at all", "image/jpeg", 400, "image"),
    }
    good = [("rocket.jpg", rocket)] * 6

    def send(item):
        body, media = item
        return predict(classifier.endpoints, STREAM, body, media, timeout=60)

    items = [(body, media) for body, media, _, _ in bad.values()] + [(data, "image/jpeg") for _, data in good]
    with ThreadPoolExecutor(len(items)) as pool:  # concurrent, so TorchServe batches good and bad together
        replies = list(pool.map(send, items))
    for (what, (_, _, status, words)), reply in zip(bad.items(), replies, strict=False):
        assert reply.status_code == status, (what, reply.status_code, reply.text)
        assert words.lower() in reply.json()["message"].lower(), (what, reply.text)
    for reply in replies[len(bad) :]:
        assert reply.status_code == 200
        assert_agrees(reply.json(), reference["rocket.jpg"])
    empty = predict(classifier.endpoints, STREAM, b"", "image/jpeg", timeout=60)
    assert empty.status_code == 400 and "empty" in empty.json()["message"]


def test_a_batch_job_over_a_folder_of_jpegs_answers_each_file(classifier, photographs, reference, tmp_path):
    folder = tmp_path / "photos"
    (folder / "nested").mkdir(parents=True)
    for name, data in photographs.items():
        (folder / ("nested" if name.startswith("m") else "") / name).write_bytes(data)
    (folder / "broken.jpg").write_bytes(photographs["rocket.jpg"][:500])
    output = tmp_path / "predictions.jsonl"
    args = job_args(folder, output, "--chunk-size", "3", "--no-progress", model="efficientnet_lite0")
    code = main([*args, "--config", str(on_server(classifier)["config"]), "--key-file", str(classifier.endpoints.key_file)])
    assert code in (EXIT_OK, EXIT_ROW_ERRORS)
    records = {record["id"]: record for record in map(orjson.loads, output.read_bytes().splitlines())}
    expected_ids = {("nested/" if name.startswith("m") else "") + name for name in photographs}
    assert set(records) == expected_ids
    for name in photographs:
        assert_agrees(records[("nested/" if name.startswith("m") else "") + name]["prediction"], reference[name])
    errors = [orjson.loads(line) for line in (tmp_path / "predictions.errors.jsonl").read_bytes().splitlines()]
    assert [error["id"] for error in errors] == ["broken.jpg"] and code == EXIT_ROW_ERRORS
