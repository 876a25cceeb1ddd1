"""Build the GPU check's bundle: every model file, weight and input the check needs, small enough to travel.

    python -m scripts.gpu.bundle [--out build/gpu-bundle]

A GPU machine may have another torch, no TorchServe, no Java and no network (docs/gpu.md), so the check
(`python -m scripts.gpu.check`) reads everything from this folder:

- digits: the archive's digits.pt2 and its TorchScript and ONNX files (made by this torch), the trained
  weights as a plain .npz (re-exported there when a file made here does not load);
- minilm: the encoder's weights rounded to fp16 (.npz, 44 MB: the fp32 files are 87 MB each, past what a
  lent machine takes along), its BERT config and tokenizer; the check rebuilds every format there from them;
- inputs: the 360 held-out digits and 240 varied sentences;
- reference answers from this machine's CPU: digits probabilities from digits.pt2, minilm embeddings from
  the fp16-rounded weights computed in fp32, so CUDA there is compared with the CPU here on the same weights.

No pickle anywhere: .npz files are written and read with allow_pickle=False, the rest is JSON.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from models.digits import formats as digits_formats
from models.digits.archive import artifacts
from models.digits.samples import held_out
from models.minilm.export import build_encoder, check_pipeline, source_dir
from models.minilm.samples import varied_sentences
from scripts import cli
from scripts.layout import BUILD

DEFAULT_OUT = BUILD / "gpu-bundle"


def write_digits(out: Path) -> None:
    program = artifacts("1.0", BUILD)[0]
    folder = out / "digits"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(program, folder / "digits.pt2")
    for fmt in ("torchscript", "onnx"):
        shutil.copy2(digits_formats.convert(program, fmt), folder)
    eager = digits_formats.eager_from_program(program)
    np.savez(folder / "weights.npz", **{name: value.numpy() for name, value in eager.state_dict().items()})
    grids, labels = held_out()
    np.savez(out / "digits_inputs.npz", grids=grids.astype(np.float32), labels=labels.astype(np.int64))
    with torch.inference_mode():
        probabilities = eager(torch.from_numpy(grids.astype(np.float32)).unsqueeze(1))
    np.savez(out / "digits_reference.npz", probabilities=probabilities.numpy())


def write_minilm(out: Path) -> None:
    source = source_dir()
    max_seq_length = check_pipeline(source)
    encoder = build_encoder(source)
    folder = out / "minilm"
    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: value.to(torch.float16).numpy() for name, value in encoder.state_dict().items() if value.is_floating_point()}
    weights.update({name: value.numpy() for name, value in encoder.state_dict().items() if not value.is_floating_point()})
    np.savez(folder / "weights_fp16.npz", **weights)
    shutil.copy2(source / "config.json", folder / "config.json")
    shutil.copy2(source / "tokenizer.json", folder / "tokenizer.json")
    sentences = varied_sentences()
    (out / "minilm_inputs.json").write_text(json.dumps({"sentences": sentences, "max_seq_length": max_seq_length}))
    # The reference: this machine's CPU on the same (fp16-rounded) weights, run through the handler's own
    # tokenizing and collating, so only the device and the torch version differ there.
    from scripts.gpu.models import minilm_core_answers, rounded_encoder

    rounded = rounded_encoder(folder)
    embeddings = minilm_core_answers(rounded, folder, sentences, max_seq_length, torch.device("cpu"))
    np.savez(out / "minilm_reference.npz", embeddings=embeddings)


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    started = time.perf_counter()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    write_digits(args.out)
    write_minilm(args.out)
    size = sum(path.stat().st_size for path in args.out.rglob("*") if path.is_file())
    meta = {"torch": torch.__version__, "built_s": round(time.perf_counter() - started, 1), "bytes": size}
    (args.out / "bundle.json").write_text(json.dumps(meta, indent=2))
    print(f"GPU check bundle -> {args.out} ({size / 2**20:.1f} MiB, torch {torch.__version__}, {meta['built_s']}s)")
    return 0


if __name__ == "__main__":
    cli.run(main)
