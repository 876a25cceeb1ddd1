"""In-process rows/s and agreement for every export format x precision of both models (CPU).

    python -m scripts.bench.formats [--threads 2] [--repeats 3] [--only digits|minilm]

digits: the held-out split tiled to 5,120 rows, micro-batches of 256 (max_batch_rows), labels and scores
against the eager CNN. minilm: 256 mixed-length sentences (models/minilm/samples.varied_sentences: 2 to
256+ tokens), micro-batches of 64 sorted by length as the handler does, cosine to sentence-transformers
(and, for int8, to the fp32 ONNX file). Rows/s is the best of `repeats` timed runs of InferenceCore.predict
on decoded rows (no HTTP, no decoding). Builds any missing file under build/ first (AOTInductor: minutes).
Prints a markdown table.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from scripts import cli
from scripts.layout import BUILD, ROOT

DIGITS_RUNS = [
    ("export", "fp32"),
    ("export", "bf16"),
    ("torchscript", "fp32"),
    ("torchscript", "bf16"),
    ("aoti", "fp32"),
    ("aoti", "bf16"),
    ("onnx", "fp32"),
]
MINILM_RUNS = DIGITS_RUNS + [("onnx", "int8")]


def _core(model_file: Path, handler: dict, precision: str):
    from handlers.core import InferenceCore
    from handlers.settings import HandlerSettings

    settings = HandlerSettings.from_yaml({"handler": {**handler, "model_file": model_file.name, "precision": precision}})
    return InferenceCore.load(model_file.parent, settings, torch.device("cpu"))


def _rate(core, rows: list, repeats: int) -> tuple[float, list]:
    results = core.predict(rows[: core.settings.max_batch_rows])  # warm-up (first-call compilation, caches)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        results = core.predict(rows)
        best = min(best, time.perf_counter() - started)
    return len(rows) / best, results


def bench_digits(repeats: int) -> list[tuple]:
    from models.digits import archive
    from models.digits.formats import eager_from_program
    from models.digits.samples import held_out

    grids, _ = held_out()
    eager = eager_from_program(archive.artifacts("1.0", BUILD)[0])
    with torch.inference_mode():
        reference = eager(torch.from_numpy(grids).unsqueeze(1)).numpy()
    rows = [grid for grid in np.resize(grids, (5120, 8, 8))]
    handler = {"task": "digit_classification", "max_batch_rows": 256}
    lines = []
    for fmt, precision in DIGITS_RUNS:
        model_file = archive.artifacts("1.0", BUILD, fmt, precision)[0]
        rate, results = _rate(_core(model_file, handler, precision), rows, repeats)
        print(f"digits {fmt} {precision}: {rate:,.0f} rows/s", file=sys.stderr)
        scores = np.array([r["scores"] for r in results[: len(grids)]])
        same = int((scores.argmax(1) == reference.argmax(1)).sum())
        agreement = f"labels = eager {same}/{len(grids)}, max score diff {np.abs(scores - reference).max():.1e}"
        lines.append(("digits", fmt, precision, model_file.name, agreement, rate))
    return lines


def bench_minilm(repeats: int) -> list[tuple]:
    from models.minilm import archive
    from models.minilm.samples import cosines, reference_embeddings, varied_sentences

    sentences = varied_sentences(256)
    reference = reference_embeddings(sentences)
    handler = yaml.safe_load((ROOT / "models" / "minilm" / "model-config.yaml").read_text())["handler"]
    handler = {**handler, "max_batch_rows": 64}
    lines, fp32_onnx = [], None
    for fmt, precision in MINILM_RUNS:
        model_file = archive.artifacts("1.0", BUILD, fmt, precision)[0]
        core = _core(model_file, handler, precision)
        rows = [core.task.decode_instance(text) for text in sentences]
        rate, results = _rate(core, rows, repeats)
        print(f"minilm {fmt} {precision}: {rate:,.1f} rows/s", file=sys.stderr)
        embeddings = np.array([r["embedding"] for r in results])
        similarity = cosines(embeddings, reference)
        agreement = f"cosine to sentence-transformers min {similarity.min():.5f}, mean {similarity.mean():.5f}"
        if (fmt, precision) == ("onnx", "fp32"):
            fp32_onnx = embeddings
        if precision == "int8" and fp32_onnx is not None:
            to_fp32 = cosines(embeddings, fp32_onnx)
            agreement += f"; to fp32 ONNX min {to_fp32.min():.4f}, mean {to_fp32.mean():.4f}"
        lines.append(("minilm", fmt, precision, model_file.name, agreement, rate))
    return lines


def main() -> None:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["digits", "minilm"])
    parser.add_argument("--precision", action="append", help="only these precisions (repeatable), e.g. --precision fp32")
    args = parser.parse_args()
    if args.precision:
        DIGITS_RUNS[:] = [run for run in DIGITS_RUNS if run[1] in args.precision]
        MINILM_RUNS[:] = [run for run in MINILM_RUNS if run[1] in args.precision]
    torch.set_num_threads(args.threads)  # onnxruntime sessions take the same count (handlers/model_files.py)
    os.environ["HF_HUB_OFFLINE"] = "1"
    lines = []
    if args.only in (None, "digits"):
        lines += bench_digits(args.repeats)
    if args.only in (None, "minilm"):
        lines += bench_minilm(args.repeats)
    print(
        f"\nIn-process rows/s, CPU, torch threads = {args.threads} "
        "(digits: batches of 256; minilm: batches of 64 mixed-length sentences)\n"
    )
    print("| model | format | precision | file | agreement | rows/s |")
    print("| --- | --- | --- | --- | --- | ---: |")
    for model, fmt, precision, name, agreement, rate in lines:
        print(f"| {model} | {fmt} | {precision} | `{name}` | {agreement} | {rate:,.0f} |")


if __name__ == "__main__":
    cli.run(main)
