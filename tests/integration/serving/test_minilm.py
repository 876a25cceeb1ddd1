"""A real TorchServe with minilm on both lanes: embeddings against sentence-transformers, raw text and
JSON instances, truncation, the empty string, curl, per-request errors."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import orjson
import pytest
import requests

from models.minilm.samples import cosines, reference_embeddings, varied_sentences
from scripts.clients.load import send_concurrently
from scripts.clients.rest import main as client_main
from scripts.clients.rest import predict
from scripts.layout import ROOT

TEXT = "text/plain; charset=utf-8"


def embed_many(endpoints, lane: str, texts: list[str]) -> list[dict]:
    reply = predict(endpoints, lane, orjson.dumps({"instances": texts}), "application/json")
    assert reply.status_code == 200, reply.text
    return reply.json()["predictions"]


def embed_one(endpoints, lane: str, text: str) -> dict:
    """A raw text body; an empty text is not a raw body (that is a 400), so it goes as one instance."""
    if not text:
        return embed_many(endpoints, lane, [text])[0]
    reply = predict(endpoints, lane, text.encode("utf-8"), TEXT)
    assert reply.status_code == 200, reply.text
    return reply.json()


def check_against_reference(sentences: list[str], results: list[dict]) -> None:
    embeddings = np.array([r["embedding"] for r in results])
    assert embeddings.shape == (len(sentences), 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    similarity = cosines(embeddings, reference_embeddings(sentences))
    assert similarity.min() >= 0.9999, f"worst row {similarity.argmin()}: {sentences[similarity.argmin()][:60]!r}"
    assert any(r["truncated"] for r in results) and not all(r["truncated"] for r in results)


def test_bulk_lane_embeds_one_large_request_like_sentence_transformers(minilm_server):
    sentences = varied_sentences()
    check_against_reference(sentences, embed_many(minilm_server.endpoints, "minilm-bulk", sentences))


def test_stream_lane_embeds_concurrent_raw_texts_like_sentence_transformers(minilm_server):
    sentences = varied_sentences()
    # Eight clients at a time, so TorchServe merges requests of different lengths into batches. An empty
    # text is not a raw body (that is a 400): it goes as one instance.
    bodies = [text.encode("utf-8") if text else orjson.dumps({"instances": [text]}) for text in sentences]
    kinds = [TEXT if text else "application/json" for text in sentences]
    answers = send_concurrently(minilm_server.endpoints, "minilm", bodies, kinds, clients=8)
    assert [answer.reply.status_code for answer in answers] == [200] * len(sentences)
    results = [
        reply.json() if text else reply.json()["predictions"][0]
        for text, reply in zip(sentences, (a.reply for a in answers), strict=True)
    ]
    check_against_reference(sentences, results)


@pytest.mark.parametrize("lane", ["minilm", "minilm-bulk"])
def test_empty_string_instance_is_embedded_and_an_empty_body_is_a_400(minilm_server, lane):
    [empty] = embed_many(minilm_server.endpoints, lane, [""])
    assert cosines([empty["embedding"]], reference_embeddings([""]))[0] >= 0.9999
    reply = predict(minilm_server.endpoints, lane, b"", TEXT)
    assert reply.status_code == 400 and "empty request body" in reply.json()["message"]


def test_a_bad_instance_names_its_position_and_text_over_the_limit_says_truncated(minilm_server):
    reply = predict(minilm_server.endpoints, "minilm", orjson.dumps({"instances": ["ok", ["not", "text"]]}), "application/json")
    assert reply.status_code == 400
    assert reply.json()["message"] == "instances[1]: expected a string, got list"
    long = embed_one(minilm_server.endpoints, "minilm", "word " * 300)
    short = embed_one(minilm_server.endpoints, "minilm", "word " * 10)
    assert long["truncated"] is True and short["truncated"] is False


def curl(endpoints, text: str, *headers: str) -> tuple[int, dict]:
    token = endpoints.token("inference")
    command = ["curl", "-s", "-w", "\n%{http_code}", "--data-binary", text, "-H", f"Authorization: Bearer {token}"]
    for header in headers:
        command += ["-H", header]
    output = subprocess.run(
        command + [endpoints.prediction_url("minilm")], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    body, _, status = output.rpartition("\n")
    return int(status), orjson.loads(body)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_with_a_text_content_type_gets_a_unit_vector_and_without_one_a_415_saying_why(minilm_server):
    status, body = curl(minilm_server.endpoints, "a sentence", "Content-Type: text/plain")
    assert status == 200 and len(body["embedding"]) == 384 and body["truncated"] is False
    assert np.linalg.norm(body["embedding"]) == pytest.approx(1.0, abs=1e-5)
    assert cosines([body["embedding"]], reference_embeddings(["a sentence"]))[0] >= 0.9999
    # curl's default is application/x-www-form-urlencoded: the front door refuses it, naming what the lane reads.
    status, body = curl(minilm_server.endpoints, "a sentence")
    assert status == 415 and "text/*" in body["message"] and body["type"] == "UnsupportedMediaType"


def test_each_lane_runs_with_its_own_batching(minilm_server):
    endpoints = minilm_server.endpoints
    described = {}
    for lane in ("minilm", "minilm-bulk"):
        reply = requests.get(f"{endpoints.management}/models/{lane}", headers=endpoints.auth("management"), timeout=30)
        [model] = reply.json()
        described[lane] = (model["batchSize"], model["maxBatchDelay"], model["responseTimeout"], len(model["workers"]))
    assert described == {"minilm": (16, 1, 7200, 2), "minilm-bulk": (2, 50, 7200, 1)}  # the archive's backstop


def test_rest_client_sends_text_and_instance_files(minilm_server, capsys):
    where = ["--config", str(minilm_server.server.config), "--key-file", str(minilm_server.endpoints.key_file)]
    assert client_main(["--model", "minilm", "--text", "a sentence", *where]) == 0
    assert len(orjson.loads(capsys.readouterr().out)["embedding"]) == 384
    assert client_main(["--model", "minilm-bulk", str(ROOT / "tests" / "fixtures" / "minilm_instances.json"), *where]) == 0
    predictions = orjson.loads(capsys.readouterr().out)["predictions"]
    assert len(predictions) == 5 and all(len(p["embedding"]) == 384 for p in predictions)
