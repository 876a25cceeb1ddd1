"""The text embedding task in-process (InferenceCore, no server) against sentence-transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tokenizers import Tokenizer

from handlers.core import InferenceCore, StageTimes
from handlers.decoding import Payload, read_body
from handlers.errors import RequestError
from handlers.model_files import load_program
from handlers.settings import HandlerSettings
from handlers.tasks import build_task
from handlers.tasks.text_embedding import TokenizedText
from models.minilm.archive import artifacts
from models.minilm.samples import cosines, reference_embeddings, varied_sentences
from scripts.layout import ROOT

MODEL_CONFIG = ROOT / "models" / "minilm" / "model-config.yaml"


def minilm_settings(**changes) -> HandlerSettings:
    handler = {**yaml.safe_load(MODEL_CONFIG.read_text())["handler"], **changes}
    return HandlerSettings.from_yaml({"handler": handler})


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    """The folder holding minilm.pt2 and tokenizer.json (exported on first use, as `make archive` does)."""
    return artifacts("1.0", ROOT / "build")[0].parent


@pytest.fixture(scope="module")
def core(minilm_dir) -> InferenceCore:
    return InferenceCore.load(minilm_dir, minilm_settings(), torch.device("cpu"))


@pytest.fixture(scope="module")
def varied_predictions(core) -> list[dict]:
    """All varied sentences in one request (embedded once, checked by several tests)."""
    return embed(core, varied_sentences())


def embed(core: InferenceCore, texts: list[str]) -> list[dict]:
    [response] = core.answer([Payload(items=texts, raw=False)])
    assert response.status == 200, response.body
    return response.body["predictions"]


def full_token_counts(minilm_dir: Path, texts: list[str]) -> list[int]:
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return [len(encoding.ids) for encoding in tokenizer.encode_batch(texts)]


def test_embeddings_match_sentence_transformers(varied_predictions):
    sentences = varied_sentences()
    assert len(sentences) >= 200
    embeddings = np.array([p["embedding"] for p in varied_predictions])
    assert embeddings.shape == (len(sentences), 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    similarity = cosines(embeddings, reference_embeddings(sentences))
    assert similarity.min() >= 0.9999, f"worst row {similarity.argmin()}: {sentences[similarity.argmin()][:60]!r}"


def test_texts_over_256_tokens_are_truncated_and_say_so(varied_predictions, minilm_dir):
    counts = full_token_counts(minilm_dir, varied_sentences())
    flags = [p["truncated"] for p in varied_predictions]
    assert flags == [count > 256 for count in counts]
    assert {255, 256, 257} <= set(counts)  # the boundary is in the set
    assert 10 <= sum(flags) < len(flags) // 2


def test_results_come_back_in_input_order_whatever_the_lengths(core):
    texts = ["short", "a much longer sentence with many more words in it than the others", "mid length text"]
    forward = [p["embedding"] for p in embed(core, texts)]
    backward = [p["embedding"] for p in embed(core, texts[::-1])]
    assert np.allclose(forward, backward[::-1], atol=1e-5)
    assert cosines(forward, reference_embeddings(texts)).min() >= 0.9999


def test_empty_string_gets_the_embedding_of_cls_sep_like_sentence_transformers(core):
    empty, blank = embed(core, ["", "  \n\t "])
    reference = reference_embeddings([""])
    assert cosines([empty["embedding"]], reference)[0] >= 0.9999
    assert np.allclose(empty["embedding"], blank["embedding"], atol=1e-6)
    assert empty["truncated"] is False


def test_raw_text_body_is_one_item_and_an_empty_body_is_a_400(core):
    [response] = core.answer([read_body(b"a sentence")])
    assert response.status == 200 and len(response.body["embedding"]) == 384
    assert cosines([response.body["embedding"]], reference_embeddings(["a sentence"]))[0] >= 0.9999
    with pytest.raises(RequestError, match="empty request body"):
        read_body(b"")


def test_bad_items_fail_alone_with_a_message_naming_them(core):
    responses = core.answer(
        [
            Payload(items=["fine", 7], raw=False),
            Payload(items=[b"\xff\xfe not utf-8"], raw=True),
            Payload(items=["still served"], raw=False),
        ]
    )
    assert [r.status for r in responses] == [400, 400, 200]
    assert responses[0].body["message"] == "instances[1]: expected a string, got int"
    assert "UTF-8" in responses[1].body["message"]
    assert len(responses[2].body["predictions"][0]["embedding"]) == 384


def test_text_that_is_not_valid_unicode_fails_alone(core):
    """JSON may carry a lone surrogate ("\\ud800"), which Python's json accepts and the tokenizer rejects."""
    responses = core.answer([Payload(items=["fine", "bad \ud800"], raw=False), Payload(items=["still served"], raw=False)])
    assert [r.status for r in responses] == [400, 200]
    assert responses[0].body["message"] == "instances[1]: text is not valid Unicode: surrogates not allowed at character 4"
    assert len(responses[1].body["predictions"][0]["embedding"]) == 384


def test_the_text_byte_limit_is_checked_before_tokenizing(minilm_dir):
    task = build_task(minilm_settings(max_text_bytes=100))
    task.text.tokenizer = None  # never loaded: a text that reached the tokenizer would fail with an AttributeError
    for text, size in [("x" * 101, "101 bytes"), ("é" * 60, "120 bytes"), ("x" * 401, "at least 401 bytes")]:
        with pytest.raises(RequestError) as caught:
            task.decode_instance(text)
        assert caught.value.code == 413
        assert caught.value.message.startswith(f"text is {size}, over the limit of 100 bytes (handler.max_text_bytes)")
    with pytest.raises(RequestError, match="text is 101 bytes, over the limit of 100 bytes") as caught:
        task.decode_raw(b"x" * 101)
    assert caught.value.code == 413


def test_a_text_at_the_byte_limit_is_embedded(minilm_dir):
    task = build_task(minilm_settings(max_text_bytes=100))
    task.load_model(minilm_dir / "minilm.pt2", torch.device("cpu"))
    assert task.decode_raw(("é" * 50).encode()).ids[0] == 101  # [CLS]


def test_micro_batches_are_padded_to_their_longest_row(minilm_dir):
    task = build_task(minilm_settings())
    rows = [TokenizedText(ids=[101, 7, 102], truncated=False), TokenizedText(ids=[101, 5, 6, 8, 9, 102], truncated=False)]
    batch = task.collate(rows, pad_to=None)
    assert batch["input_ids"].shape == (2, 6)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]
    fixed = task.collate(rows, pad_to=8)
    assert fixed["input_ids"].shape == (8, 256)
    assert fixed["attention_mask"].sum(dim=1).tolist() == [3, 6, 1, 1, 1, 1, 1, 1]


def test_deterministic_mode_gives_bitwise_equal_results_alone_or_in_company(minilm_dir):
    core = InferenceCore.load(minilm_dir, minilm_settings(deterministic=True, max_batch_rows=4), torch.device("cpu"))
    text = "The same sentence, whatever shares its batch."
    alone = embed(core, [text])[0]["embedding"]
    company = embed(core, ["x", "a far longer neighbour " * 20, text, "y z"])[2]["embedding"]
    assert alone == company


def test_a_pass_holds_at_most_max_batch_tokens_padded_tokens_with_the_same_answers(minilm_dir, core):
    """Short texts share one pass; 256-token ones run 4 at a time (the stream lanes' 1024): each row's embedding
    is the one a single 16-row pass gives."""
    texts = [f"short text {n}" for n in range(10)] + [f"long text {n} " + "word " * 300 for n in range(6)]
    bounded, unbounded = StageTimes(), StageTimes()
    [response] = core.answer([Payload(items=texts, raw=False)], bounded)
    whole = InferenceCore.load(minilm_dir, minilm_settings(max_batch_tokens=None), torch.device("cpu"))
    [reference] = whole.answer([Payload(items=texts, raw=False)], unbounded)
    assert core.settings.max_batch_tokens == 1024 and core.settings.max_batch_rows == 16
    assert bounded.forward_rows == [10, 4, 2] and unbounded.forward_rows == [16]
    embeddings = [p["embedding"] for p in response.body["predictions"]]
    np.testing.assert_allclose(embeddings, [p["embedding"] for p in reference.body["predictions"]], atol=1e-5)
    assert cosines(embeddings, reference_embeddings(texts)).min() >= 0.9999


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"max_seq_length": 512}, "max_seq_length must be an integer in 2..256"), ({"max_seq_length": "256"}, "max_seq_length")],
)
def test_bad_settings_fail_at_start_up(changes, message):
    with pytest.raises(ValueError, match=message):
        build_task(minilm_settings(**changes))


def test_missing_tokenizer_file_is_named(minilm_dir, tmp_path):
    (tmp_path / "minilm.pt2").symlink_to(minilm_dir / "minilm.pt2")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        InferenceCore.load(tmp_path, minilm_settings(), torch.device("cpu"))


def test_the_program_moves_whole_to_another_device(minilm_dir):
    """The graph's own device arguments (mask aranges, casts) follow the weights: checked on the meta
    device, where a tensor left on the CPU fails ("cannot copy out of meta tensor"); the real CUDA run
    is the gpu test below."""
    module = load_program(minilm_dir / "minilm.pt2", torch.device("meta"))
    input_ids = torch.ones((3, 20), dtype=torch.long, device="meta")
    output = module(input_ids, torch.ones_like(input_ids))
    assert output.device.type == "meta" and output.shape == (3, 384)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_embeddings_match_sentence_transformers(minilm_dir):
    from handlers.core import select_device

    sentences = varied_sentences()
    core = InferenceCore.load(minilm_dir, minilm_settings(), select_device(0))
    embeddings = [p["embedding"] for p in embed(core, sentences)]
    assert cosines(embeddings, reference_embeddings(sentences)).min() >= 0.9999
