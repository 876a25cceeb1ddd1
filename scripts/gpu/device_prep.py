"""Everything one device call carries beside the working tree, in build/gpu-device/ (carry it by that name):

    python -m scripts.gpu.device_prep          (make gpu-device-prep)

- torchserve.tar.xz: the serving bundle (scripts/gpu/serving_bundle.py), unpacked there into build/gpu-serving;
- digits.mar and noop.mar with their sha256 (the GPU machine has no torch-model-archiver); the archives' handler
  code is replaced there by the working tree's (scripts/gpu/device_run.py), so a stale archive cannot mislead;
- minilm/: the encoder's fp16-rounded weights with the embedding rows of every token the device's inputs never
  use set to zero (their answers are unchanged; zeros pack to nothing), config.json, tokenizer.json and the
  archive's model-config.yaml and manifest: minilm.mar is assembled there around a .pt2 exported there;
- wheels/: orjson for Python 3.12 (the handler imports it; the GPU machine lacks it), downloaded once by pip.

With the ~3.5 MiB working tree that is under the 64 MiB one call carries, so each call stands alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from models.minilm.samples import varied_sentences
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.bench.peers.noop_handler import build_noop_archive
from scripts.errors import ArchiveError
from scripts.gpu import serving_bundle
from scripts.layout import BUILD, MODEL_STORE

OUT = BUILD / "gpu-device"
ORJSON = "orjson==3.13.0"  # locks/serving-cpu.txt
BENCH_SENTENCE = "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill."
MINILM_ENTRIES = ("model-config.yaml", "MAR-INF/MANIFEST.json", "tokenizer.json")
WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"


def device_texts() -> list[str]:
    """Every text the device scripts send: the benchmarks' sentence and the check's varied sentences."""
    return [BENCH_SENTENCE, *varied_sentences()]


def used_token_ids(tokenizer_file: Path, texts: list[str]) -> set[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ids = {token for encoding in tokenizer.encode_batch(texts) for token in encoding.ids}
    return ids | set(range(110))  # [PAD], [UNK], [CLS], [SEP], [MASK] and the other reserved ids


def write_minilm(out: Path) -> int:
    """out/minilm/: the pruned fp16 weights and the small archive entries; returns the rows kept."""
    from models.minilm.export import build_encoder, source_dir

    folder = out / "minilm"
    folder.mkdir(parents=True, exist_ok=True)
    source = source_dir()
    with zipfile.ZipFile(MODEL_STORE / "minilm.mar") as mar:
        for name in MINILM_ENTRIES:
            (folder / Path(name).name).write_bytes(mar.read(name))
    shutil.copy2(source / "config.json", folder / "config.json")
    keep = sorted(used_token_ids(folder / "tokenizer.json", device_texts()))
    state = build_encoder(source).state_dict()
    weights = {name: (value.half() if value.is_floating_point() else value).numpy() for name, value in state.items()}
    pruned = np.zeros_like(weights[WORD_EMBEDDINGS])
    pruned[keep] = weights[WORD_EMBEDDINGS][keep]
    weights[WORD_EMBEDDINGS] = pruned
    np.savez_compressed(folder / "weights_fp16_pruned.npz", **weights)
    (folder / "kept_ids.json").write_text(json.dumps(keep))
    return len(keep)


def copy_archive(name: str, out: Path) -> None:
    source = MODEL_STORE / name
    if not source.exists():
        raise ArchiveError(f"{source} is missing: run `make archive` first")
    MarFile(source).copy(out / name)


def download_orjson(out: Path) -> None:
    wheels = out / "wheels"
    if any(wheels.glob("orjson-*-cp312-*.whl")):
        return
    wheels.mkdir(parents=True, exist_ok=True)
    platforms = ["--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    subprocess.run([*command, "--implementation", "cp", *platforms, "-d", str(wheels), ORJSON], check=True)


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    serving_bundle.ensure_tree()
    shutil.copy2(serving_bundle.ensure_packed(serving_bundle.DEFAULT_OUT), args.out / serving_bundle.PACKED)
    copy_archive("digits.mar", args.out)
    noop = build_noop_archive(BUILD / "gpu-device-noop")
    MarFile(noop).record_digest()
    MarFile(noop).copy(args.out / "noop.mar")
    kept = write_minilm(args.out)
    download_orjson(args.out)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"device carry -> {args.out}: {total / 2**20:.1f} MiB (minilm keeps {kept} embedding rows)")
    return 0


if __name__ == "__main__":
    cli.run(main)
