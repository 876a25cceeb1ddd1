"""Text embedding task (`minilm`): UTF-8 text -> {"embedding": [384 unit-length floats], "truncated": bool}.

Decoding (sizes, Unicode, tokens) is handlers/texts.py's, shared by text tasks; the exported model does mean pooling
and L2 normalisation itself. Batches are padded to their longest row only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handlers.errors import SettingsError
from handlers.model_files import load_program
from handlers.tasks.base import Task, instances_body
from handlers.texts import TextDecoder, TokenizedText

__all__ = ["TextEmbedding", "TextEmbeddingOptions", "TokenizedText"]

DEFAULT_TOKENIZER_FILE = "tokenizer.json"
# The export's sequence axis ends here (models/minilm/export.py); a longer setting could not run.
EXPORTED_MAX_SEQ_LENGTH = 256
# handler.max_text_bytes' default: 256 tokens of any language fit in far less, and tokenizing 64 KiB takes
# milliseconds (a whole text is tokenized before it is cut to max_seq_length tokens).
DEFAULT_MAX_TEXT_BYTES = 64 * 1024


@dataclass(frozen=True)
class TextEmbeddingOptions:
    # Shipped beside the model file in the archive.
    tokenizer_file: str = DEFAULT_TOKENIZER_FILE
    # Longer texts are cut to this many tokens ([CLS] and [SEP] included) and answered with "truncated": true.
    max_seq_length: int = EXPORTED_MAX_SEQ_LENGTH
    # The most UTF-8 bytes one text may have; checked before it is tokenized. Longer texts get a 413.
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES
    # A micro-batch is padded to its longest row, rounded up to a multiple of this (capped at max_seq_length).
    # 1: no rounding (the CPU's best: no wasted tokens). On CUDA, bf16/fp16 kernels are chosen anew for each
    # new sequence length, which cost a lone request tens of milliseconds on an H200 (docs/gpu.md); rounding to
    # 16 or 32 bounds the lengths a lane ever sees. Padding does not change an embedding (the mask excludes it).
    pad_to_multiple: int = 1

    def check(self) -> None:
        if not 2 <= self.max_seq_length <= EXPORTED_MAX_SEQ_LENGTH:
            raise SettingsError(
                f"handler.max_seq_length must be an integer in 2..{EXPORTED_MAX_SEQ_LENGTH}, got {self.max_seq_length!r}"
            )
        if self.pad_to_multiple < 1:
            raise SettingsError(f"handler.pad_to_multiple must be a positive integer, got {self.pad_to_multiple!r}")
        if self.max_text_bytes < 1:
            raise SettingsError(f"handler.max_text_bytes must be a positive integer, got {self.max_text_bytes!r}")


class TextEmbedding(Task):
    name = "text_embedding"
    Options = TextEmbeddingOptions
    # Media types a raw body may be sent as (handlers/decoding.py RequestLimits).
    raw_media = ("text/", "application/octet-stream")
    request_bodies = {
        "application/json": instances_body({"type": "string"}),
        "text/plain": {"type": "string", "minLength": 1},
    }

    def __init__(self, options: TextEmbeddingOptions) -> None:
        self.tokenizer_file = options.tokenizer_file
        self.max_seq_length = options.max_seq_length
        self.pad_to_multiple = options.pad_to_multiple
        self.text = TextDecoder(options.max_text_bytes, options.max_seq_length)

    def load_model(self, model_path: Path, device: torch.device):
        self.load_files(model_path.parent)
        return load_program(model_path, device)

    def load_files(self, folder: Path) -> None:
        # The tokenizer ships beside the model file, so it is loaded here, where the archive folder is known.
        self.text.load(folder / self.tokenizer_file)

    # -- decode ---------------------------------------------------------------------------------

    def decode_raw(self, body: bytes | str) -> TokenizedText:
        return self.text.from_body(body)

    GRAPH_EXAMPLE_ITEM = "a"  # decoded once to capture CUDA graphs (handlers/cuda_graphs.py)

    def decode_instance(self, item: Any) -> TokenizedText:
        return self.text.from_instance(item)

    # -- batch ----------------------------------------------------------------------------------

    def collate(self, rows: Sequence[TokenizedText], pad_to: int | None) -> dict[str, torch.Tensor]:
        """Pad to the longest row of this micro-batch; deterministic mode (`pad_to`) pads to a fixed
        (pad_to, max_seq_length) shape instead, so results do not depend on batch company."""
        count = len(rows) if pad_to is None else max(pad_to, len(rows))
        if pad_to is None:
            longest = max(len(row.ids) for row in rows)
            length = min(self.max_seq_length, -(-longest // self.pad_to_multiple) * self.pad_to_multiple)
        else:
            length = self.max_seq_length
        input_ids = torch.full((count, length), self.text.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((count, length), dtype=torch.long)
        for index, row in enumerate(rows):
            input_ids[index, : len(row.ids)] = torch.tensor(row.ids, dtype=torch.long)
            attention_mask[index, : len(row.ids)] = 1
        # Padding rows attend to one token so no row is fully masked; their outputs are dropped.
        attention_mask[len(rows) :, 0] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def forward(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(batch["input_ids"], batch["attention_mask"])

    def unbatch(self, outputs: torch.Tensor, rows: Sequence[TokenizedText]) -> list[dict]:
        return [{"embedding": vector, "truncated": row.truncated} for vector, row in zip(outputs.tolist(), rows, strict=True)]

    def row_cost(self, row: TokenizedText) -> int:
        return len(row.ids)
