"""Refuse a torch.export file (.pt2) that would make torch.export.load unpickle anything.

A .pt2 written by torch.export.save keeps its graph as JSON and its tensors as raw bytes, but its
format can also carry pickles, and torch.export.load (torch 2.13) unpickles them without restriction:
payloads flagged `use_pickle` (torch.load(weights_only=False)), custom and opaque objects among the
constants (pickle.loads), and small torch.save files (sample inputs, legacy weights and constants),
which it first loads with weights_only=True and, if that fails, again with weights_only=False. A
crafted file could run code when a worker loads it. The exported models here need none of that, so
before loading: no pickled payload or object, and every torch.save member must load with
weights_only=True (torch's restricted unpickler, tensors and containers only), so the fallback never runs.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import torch

# Member names inside a .pt2 (under its root folder), from torch.export.pt2_archive.constants.
PAYLOAD_CONFIGS = ("_weights_config.json", "_constants_config.json")
PICKLED_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")
TORCH_SAVE_SUFFIX = ".pt"


class PickleInModelFile(ValueError):
    """The model file holds something torch.export.load would unpickle."""


def refuse_pickles(path: Path) -> None:
    """Raise PickleInModelFile naming the first member of the .pt2 at `path` that would be unpickled."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as error:
        raise PickleInModelFile(f"{path.name} is not a torch.export file (not a zip archive: {error})") from None
    with archive:
        for member in archive.namelist():
            if member.endswith(PAYLOAD_CONFIGS):
                _check_payload_config(path, member, archive.read(member))
            elif member.endswith(TORCH_SAVE_SUFFIX):
                _check_torch_save(path, member, archive.read(member))


def _check_payload_config(path: Path, member: str, data: bytes) -> None:
    try:
        entries = json.loads(data)["config"]
    except (ValueError, KeyError, TypeError):
        raise PickleInModelFile(f"{path.name}: {member} is not a torch.export payload config") from None
    for name, entry in entries.items():
        pickled = entry.get("use_pickle") or str(entry.get("path_name", "")).startswith(PICKLED_OBJECT_PREFIXES)
        if pickled:
            raise PickleInModelFile(
                f"{path.name}: {name!r} in {member} is stored as a pickle, which loading would run; "
                f"export models whose weights and constants are plain tensors"
            )


def _check_torch_save(path: Path, member: str, data: bytes) -> None:
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # whatever the restricted unpickler refuses, torch would retry unrestricted
        raise PickleInModelFile(
            f"{path.name}: {member} holds a pickle that torch's weights-only loader refuses ({type(error).__name__}); "
            f"torch.export.load would unpickle it without restriction, so the file is not loaded"
        ) from None
