"""The prepared device calls' pieces that run anywhere: archives assembled around the working tree's handler code,
and minilm's pruned vocabulary keeping every token the device's inputs use."""

from __future__ import annotations

import zipfile

from handlers.decoding import Payload
from models.digits.samples import held_out
from scripts.archive.reader import MarFile
from scripts.gpu import device_prep, device_run
from scripts.layout import MODEL_STORE, ROOT


def test_an_assembled_archive_carries_the_working_trees_handlers_and_answers(tmp_path, monkeypatch):
    monkeypatch.setattr(device_run, "WORK", tmp_path)
    archive = device_run.digits_archive(MODEL_STORE / "digits.mar")
    assert MarFile(archive).recorded_digest() == MarFile(archive).sha256()
    with zipfile.ZipFile(archive) as mar:
        assert mar.read("handlers/cuda_graphs.py") == (ROOT / "handlers" / "cuda_graphs.py").read_bytes()
        assert mar.read("torchserve_handler.py") == (ROOT / "handlers" / "torchserve" / "torchserve_handler.py").read_bytes()
        with zipfile.ZipFile(MODEL_STORE / "digits.mar") as original:
            assert mar.read("digits.pt2") == original.read("digits.pt2")
    graphs = device_run.variant(archive, "graphs", {"cuda_graphs": {"digits-graphs": True, "default": False}})
    assert MarFile(graphs).settings().device.graphs_for("digits-graphs")
    grids, labels = held_out(8)
    [response] = device_run.core_of(graphs).answer([Payload(items=[g.tolist() for g in grids], raw=False)])
    assert [p["label"] for p in response.body["predictions"]] == labels.tolist()


def test_the_pruned_vocabulary_keeps_every_token_of_the_device_inputs(tmp_path):
    from tokenizers import Tokenizer

    path = tmp_path / "tokenizer.json"
    with zipfile.ZipFile(MODEL_STORE / "minilm.mar") as mar:
        path.write_bytes(mar.read("tokenizer.json"))
    texts = device_prep.device_texts()
    kept = device_prep.used_token_ids(path, texts)
    encoded = Tokenizer.from_file(str(path)).encode_batch(texts)
    assert {token for encoding in encoded for token in encoding.ids} <= kept
    assert {0, 100, 101, 102} <= kept  # [PAD], [UNK], [CLS], [SEP]
    assert len(kept) < 2000  # of 30,522: the rest are zeros in what travels
