"""Text decoding every text task shares, bounded before the work it bounds (as handlers/images.py is for images).

A raw body or a JSON instance becomes token ids in three checked steps:
- its size: a text over `max_text_bytes` UTF-8 bytes is a 413 before it is encoded or tokenized (a str of more than
  4 x the limit characters is refused without encoding it: a character is 1 to 4 bytes);
- its text: a body must be UTF-8, an instance a str of valid Unicode (a JSON "\\ud800" escape gives a lone surrogate):
  a 400 naming the place;
- its tokens: the `tokenizers` library's tokenizer (tokenizer.json shipped in the archive), cut to `max_tokens`
  ([CLS] and [SEP] included), the cut said in the row (`truncated`), never an error. Padding is the task's, per
  micro-batch.

Control characters, NUL included, are text: the tokenizer drops them, as sentence-transformers does. An empty or blank
text becomes [CLS][SEP] and has an answer too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from tokenizers import Tokenizer

from handlers.errors import RequestError, too_large

PAD_TOKEN = "[PAD]"


class TokenizedText(NamedTuple):
    """One row: token ids with [CLS]/[SEP], at most max_tokens of them, and whether text was cut."""

    ids: list[int]
    truncated: bool


class TextDecoder:
    def __init__(self, max_text_bytes: int, max_tokens: int) -> None:
        self.max_text_bytes = max_text_bytes
        self.max_tokens = max_tokens
        self.tokenizer: Tokenizer | None = None
        self.pad_id = 0

    def load(self, path: Path) -> None:
        """The tokenizer from `path` (a tokenizer.json), its hub defaults replaced: no padding, cut at max_tokens."""
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} not found in the archive (handler.tokenizer_file)")
        tokenizer = Tokenizer.from_file(str(path))
        # tokenizer.json carries the hub's defaults (fixed padding, 128-token truncation): replace them.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=self.max_tokens)
        pad_id = tokenizer.token_to_id(PAD_TOKEN)
        self.pad_id = 0 if pad_id is None else pad_id
        self.tokenizer = tokenizer

    def from_body(self, body: bytes | str) -> TokenizedText:
        """A raw request body (text/plain or octet-stream), checked on its size before it is decoded."""
        if isinstance(body, (bytes, bytearray)):
            self._check_size(len(body))
            try:
                body = bytes(body).decode("utf-8")
            except UnicodeDecodeError as error:
                raise RequestError(f'body must be UTF-8 text (or JSON {{"instances": [str, ...]}}): {error}') from None
        return self.tokenize(self.checked(body))

    def from_instance(self, item: Any) -> TokenizedText:
        """One JSON instance: a string."""
        if not isinstance(item, str):
            raise RequestError(f"expected a string, got {type(item).__name__}")
        return self.tokenize(self.checked(item))

    def checked(self, text: str) -> str:
        """`text` if it is within max_text_bytes and valid Unicode: a 413 or 400 naming what is wrong otherwise."""
        if len(text) > 4 * self.max_text_bytes:  # a character is 1 to 4 bytes: no need to encode a text far over
            self._check_size(len(text), at_least=True)
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as error:  # a lone surrogate from a JSON "\ud800" escape
            raise RequestError(f"text is not valid Unicode: {error.reason} at character {error.start}") from None
        self._check_size(size)
        return text

    def tokenize(self, text: str) -> TokenizedText:
        encoding = self.tokenizer.encode(text)
        return TokenizedText(ids=encoding.ids, truncated=bool(encoding.overflowing))

    def _check_size(self, size: int, at_least: bool = False) -> None:
        if size > self.max_text_bytes:
            raise too_large(
                f"text is {'at least ' if at_least else ''}{size} bytes, over the limit of {self.max_text_bytes} bytes "
                "(handler.max_text_bytes); "
                f"only its first {self.max_tokens} tokens are read anyway: send a shorter text"
            )
