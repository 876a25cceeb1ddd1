"""all-MiniLM-L6-v2 where only torch and transformers are (models/portable.py): the encoder's weights rounded to fp16
with the embedding rows of every token the device's texts never use set to zero (their answers are unchanged; zeros
pack to nothing), and its BERT config; rebuilt as SentenceEncoder around transformers' BertModel, computed in fp32."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from models import registry
from models.minilm.export import MAX_EXPORT_BATCH, SentenceEncoder
from models.portable import Portable, load_weights, save_weights

WEIGHTS = "weights_fp16_pruned.npz"
WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
RESERVED_IDS = 110  # [PAD], [UNK], [CLS], [SEP], [MASK] and the other reserved ids


def used_token_ids(tokenizer_file: Path, texts: Sequence[str]) -> set[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ids = {token for encoding in tokenizer.encode_batch(list(texts)) for token in encoding.ids}
    return ids | set(range(RESERVED_IDS))


class MiniLM(Portable):
    name = stem = "minilm"
    input_names = ("input_ids", "attention_mask")
    output_name = "embeddings"
    max_batch = MAX_EXPORT_BATCH
    agreement = {
        "fp32": {"cosine": {"embedding": 0.9999}},
        "bf16": {"cosine": {"embedding": 0.99}},
        "fp16": {"cosine": {"embedding": 0.999}},
    }
    cpu_speed_max_batch = 512  # a call of more texts takes tens of seconds on a CPU
    speed_options = {"pad_to_multiple": 32}  # sequence lengths rounded up to multiples of 32 (handler.pad_to_multiple)
    precision_variants = {"no cuDNN attention": {"sdpa_backends": ["flash", "efficient", "math"]}}

    def items(self) -> list[Any]:
        from models.minilm.samples import varied_sentences

        return varied_sentences()

    def long_item(self) -> str:
        return "word " * 400  # past max_seq_length: truncated to its 256 tokens

    def write(self, folder: Path, items: Sequence[Any]) -> None:
        from models.minilm.export import build_encoder, check_pipeline, source_dir

        source = source_dir()
        check_pipeline(source)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / "config.json", folder / "config.json")
        texts = [item for item in items if isinstance(item, str)]
        keep = sorted(used_token_ids(source / "tokenizer.json", texts))
        state = {name: value.clone() for name, value in build_encoder(source).state_dict().items()}
        pruned = torch.zeros_like(state[WORD_EMBEDDINGS])
        pruned[keep] = state[WORD_EMBEDDINGS][keep]
        state[WORD_EMBEDDINGS] = pruned
        save_weights(folder / WEIGHTS, state, half=True)
        (folder / "kept_ids.json").write_text(json.dumps(keep))

    def eager(self, folder: Path) -> SentenceEncoder:
        from transformers import BertConfig, BertModel, logging

        logging.set_verbosity_error()
        config = BertConfig.from_dict(json.loads((folder / "config.json").read_text()))
        config._attn_implementation = "sdpa"  # as models/minilm/export.py builds it
        encoder = SentenceEncoder(BertModel(config, add_pooling_layer=False))
        encoder.load_state_dict(load_weights(folder / WEIGHTS), strict=True)
        return encoder.eval()

    def example(self, device: torch.device):
        # torch.export on CUDA adds a guard on the sequence length from the attention kernel's alignment that the
        # dynamic axis violates: scripts/gpu/ exports on the CPU and moves the program.
        max_seq_length = registry.model(self.name).handler_config()["handler"]["max_seq_length"]
        batch = torch.export.Dim("batch", min=1, max=self.max_batch)
        sequence = torch.export.Dim("sequence", min=2, max=max_seq_length)
        ids = torch.randint(1000, 2000, (3, 17), device=device)
        mask = torch.ones_like(ids)
        mask[1, 9:] = 0
        return (ids, mask), [{0: batch, 1: sequence}] * 2


PORTABLE = MiniLM()
