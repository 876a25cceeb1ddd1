"""In-process rows/s and agreement for every export format x precision of every model (CPU).

    python -m scripts.bench.formats [--threads 2] [--repeats 3] [--models NAME ...] [--formats export onnx]
                                    [--precision fp32]

Each model's samples (models/<name>/samples.json) cycled to its rows (max_batch_rows x PASSES), decoded once, then
run through InferenceCore.predict in micro-batches of max_batch_rows from the model's model-config.yaml, for each
serving file its folder builds (models/<name>/archive.py `artifacts`; AOTInductor's compile takes minutes). Rows/s
is the best of `repeats` timed runs (no HTTP, no decoding). Agreement: how many samples get the answer samples.json
says (as its match says: labels equal, scores within a bound, cosines above one), and the largest difference of
any number in an answer to the fp32 export's (models/registry.largest_difference; a label that differs reads inf).
Prints a markdown table; docs/benchmarks.md quotes a run.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

import torch

from handlers.decoding import Payload
from models import registry
from scripts import cli
from scripts.layout import BUILD

# Every format x precision the folders can build (models/export_formats.py): bf16 and fp16 of export and TorchScript
# are casts at load time (fp16 is CUDA only), AOTInductor builds bf16 into its file, ONNX int8 is quantized at build.
RUNS = (
    ("export", "fp32"),
    ("export", "bf16"),
    ("torchscript", "fp32"),
    ("torchscript", "bf16"),
    ("aoti", "fp32"),
    ("aoti", "bf16"),
    ("onnx", "fp32"),
    ("onnx", "int8"),
)
PASSES = 8  # micro-batches per timed run


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


def bench_model(name: str, runs: list[tuple[str, str]], repeats: int) -> list[tuple]:
    """One line per (format, precision) of `name`: its file, agreement and rows/s."""
    found = registry.model(name)
    archive = importlib.import_module(f"models.{name}.archive")  # each folder's `artifacts` (models/registry.py)
    handler = found.handler_config()["handler"]
    samples = found.samples()
    lines, reference = [], None
    for fmt, precision in [("export", "fp32"), *[run for run in runs if run != ("export", "fp32")]]:
        model_file = archive.artifacts("1.0", BUILD, fmt, precision)[0]
        core = _core(model_file, handler, precision)
        rows = core.decode(Payload(samples.request(core.settings.max_batch_rows * PASSES), raw=False))
        rate, results = _rate(core, rows, repeats)
        print(f"{name} {fmt} {precision}: {rate:,.1f} rows/s", file=sys.stderr)
        first = results[: len(samples.instances)]
        agreeing = sum(samples.problem(result, answer) is None for result, answer in zip(first, samples.answers, strict=True))
        reference = reference if reference is not None else first
        difference = max(registry.largest_difference(a, b) for a, b in zip(first, reference, strict=True))
        agreement = f"samples as samples.json says {agreeing}/{len(samples.instances)}; to fp32 export {difference:.1e}"
        if (fmt, precision) in runs:
            lines.append((name, fmt, precision, model_file.name, agreement, rate))
    return lines


def main() -> None:
    parser = cli.parser_for(__doc__)
    known = sorted(registry.models())
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=known, default=known)
    parser.add_argument("--formats", nargs="+", choices=sorted({fmt for fmt, _ in RUNS}), help="only these formats")
    parser.add_argument("--precision", action="append", help="only these precisions (repeatable), e.g. --precision fp32")
    args = parser.parse_args()
    runs = [(f, p) for f, p in RUNS if (not args.formats or f in args.formats) and (not args.precision or p in args.precision)]
    torch.set_num_threads(args.threads)  # onnxruntime sessions take the same count (handlers/model_files.py)
    os.environ["HF_HUB_OFFLINE"] = "1"
    lines = [line for name in args.models for line in bench_model(name, runs, args.repeats)]
    print(f"\nIn-process rows/s, CPU, torch threads = {args.threads} (micro-batches of each model's max_batch_rows)\n")
    print("| model | format | precision | file | agreement | rows/s |")
    print("| --- | --- | --- | --- | --- | ---: |")
    for model, fmt, precision, name, agreement, rate in lines:
        print(f"| {model} | {fmt} | {precision} | `{name}` | {agreement} | {rate:,.1f} |")


if __name__ == "__main__":
    cli.run(main)
