"""Build the GPU check's bundle: every model's weights, inputs and CPU answers, small enough to travel.

    python -m scripts.gpu.bundle [--out build/gpu-bundle] [--models NAME ...]

A GPU machine may have another torch, no TorchServe, no Java and no network (docs/gpu.md), so the check
(`python -m scripts.gpu.check`) reads everything from this folder, one sub-folder per model in models/, each
written as the model's folder declares (models/<name>/portable.py):

- the plain weights (`write`: .npz, fp16-rounded where the model says so) and what `eager` reads beside them; the
  check exports every serving format there from them, with that machine's torch;
- archive/: the archive's other entries (model-config.yaml, a tokenizer, class names), as `make archive` built them;
- items.json: the request instances the check sends (`items`);
- reference.json: this machine's CPU answers to them, through the handler's core around the eager module rebuilt
  from those same weights, so CUDA there is compared with the CPU here on the same weights;
- site/: the pure-Python packages a model's `eager` imports (`packages`), put on sys.path there.

No pickle anywhere: .npz files are written and read with allow_pickle=False, the rest is JSON.
"""

from __future__ import annotations

import json
import shutil
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import torch

from models import registry
from models.portable import copy_packages, of
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.errors import ArchiveError
from scripts.layout import BUILD, MODEL_STORE

DEFAULT_OUT = BUILD / "gpu-bundle"
ARCHIVE_FILES = "archive"
ITEMS = "items.json"
REFERENCE = "reference.json"
SITE = "site"
CODE_ENTRIES = ("handlers/", "torchserve_handler.py")


def archive_entries(name: str) -> dict[str, bytes]:
    """The model's archive's entries but its code and its model file (both are made there)."""
    path = MODEL_STORE / f"{name}.mar"
    if not path.exists():
        raise ArchiveError(f"{path} is missing: run `make archive` first")
    model_file = registry.model(name).handler_config()["handler"]["model_file"]
    built = MarFile(path).settings().model_file
    if built != model_file:
        raise ArchiveError(
            f"{path} serves {built}, not the folder's {model_file}: the GPU bundle is made from the default archive "
            f"(make archive without FORMAT or PRECISION); the GPU machine exports every format itself"
        )
    with zipfile.ZipFile(path) as mar:
        return {
            entry: mar.read(entry)
            for entry in mar.namelist()
            if not entry.startswith(CODE_ENTRIES) and entry != model_file and not entry.endswith("/")
        }


def write_entries(entries: dict[str, bytes], folder: Path) -> None:
    for entry, data in entries.items():
        target = folder / entry
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def write_model(name: str, out: Path, extra_items: Sequence = (), site: Path | None = None, reference: bool = True) -> int:
    """out/<name>/ as the module says, its packages into `site` (default out/site/); `extra_items` are other
    instances the device sends (kept by a pruning `write`). Returns the items' count."""
    from scripts.gpu import models

    portable = of(name)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    items = portable.items()
    long_item = portable.long_item()
    portable.write(folder, [*items, *extra_items, *([long_item] if long_item is not None else [])])
    write_entries(archive_entries(name), folder / ARCHIVE_FILES)
    (folder / ITEMS).write_text(json.dumps(items))
    copy_packages(portable.packages, site or out / SITE)
    if not reference:
        return len(items)
    settings = models.settings(name, f"{portable.stem}.pt2")
    core = models.eager_core(portable.eager(folder), settings, folder / ARCHIVE_FILES, torch.device("cpu"))
    (folder / REFERENCE).write_text(json.dumps(models.answers(core, items)))
    return len(items)


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    names = list(registry.models())
    parser.add_argument("--models", nargs="+", choices=names, default=names)
    args = parser.parse_args()
    started = time.perf_counter()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    counts = {name: write_model(name, args.out) for name in args.models}
    size = sum(path.stat().st_size for path in args.out.rglob("*") if path.is_file())
    meta = {"torch": torch.__version__, "built_s": round(time.perf_counter() - started, 1), "bytes": size, "items": counts}
    (args.out / "bundle.json").write_text(json.dumps(meta, indent=2))
    print(f"GPU check bundle -> {args.out} ({size / 2**20:.1f} MiB, torch {torch.__version__}, {meta['built_s']}s): {counts}")
    return 0


if __name__ == "__main__":
    cli.run(main)
