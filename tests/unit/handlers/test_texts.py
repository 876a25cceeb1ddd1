"""The shared text decoder (handlers/texts.py) on its own, as a second text task would use it: each bound is checked
before the work it bounds, and the tokenizer cuts to the decoder's own token limit."""

from __future__ import annotations

import pytest

from handlers.errors import RequestError
from handlers.texts import TextDecoder, TokenizedText
from models.minilm.archive import artifacts
from scripts.layout import ROOT


@pytest.fixture(scope="module")
def tokenizer_file():
    return artifacts("1.0", ROOT / "build")[0].parent / "tokenizer.json"


def test_sizes_and_unicode_are_refused_before_any_tokenizer_is_loaded():
    decoder = TextDecoder(max_text_bytes=10, max_tokens=8)  # nothing loaded: tokenizing would raise AttributeError
    cases = [
        (lambda: decoder.from_body(b"x" * 11), 413, "text is 11 bytes, over the limit of 10 bytes (handler.max_text_bytes)"),
        (lambda: decoder.from_instance("é" * 6), 413, "text is 12 bytes, over the limit of 10 bytes"),
        (lambda: decoder.from_instance("x" * 41), 413, "text is at least 41 bytes"),
        (lambda: decoder.from_body(b"\xff\xfe"), 400, "body must be UTF-8 text"),
        (lambda: decoder.from_instance("a\ud800"), 400, "text is not valid Unicode: surrogates not allowed at character 1"),
        (lambda: decoder.from_instance(7), 400, "expected a string, got int"),
    ]
    for call, code, message in cases:
        with pytest.raises(RequestError) as caught:
            call()
        assert caught.value.code == code and caught.value.message.startswith(message), caught.value.message
    assert "only its first 8 tokens are read" in pytest.raises(RequestError, decoder.from_body, b"x" * 11).value.message


def test_the_tokenizer_cuts_to_the_decoders_token_limit_and_says_so(tokenizer_file):
    decoder = TextDecoder(max_text_bytes=1000, max_tokens=6)
    decoder.load(tokenizer_file)
    assert decoder.pad_id == 0  # [PAD] in MiniLM's vocabulary
    short = decoder.from_instance("hello world")
    assert short == TokenizedText(ids=[101, 7592, 2088, 102], truncated=False)
    cut = decoder.from_body(b"one two three four five six seven")
    assert len(cut.ids) == 6 and cut.ids[0] == 101 and cut.ids[-1] == 102 and cut.truncated
    assert decoder.from_instance("") == TokenizedText(ids=[101, 102], truncated=False)


def test_a_missing_tokenizer_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer file .*nothing.json not found in the archive"):
        TextDecoder(10, 8).load(tmp_path / "nothing.json")
