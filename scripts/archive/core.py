"""The handler core as TorchServe builds it from a .mar: the archive's model-config.yaml and model file,
loaded on this machine's device. Batch jobs in process, the benchmark peers and the image test use it."""

from __future__ import annotations

from pathlib import Path

import torch

from handlers.core import InferenceCore, select_device
from handlers.host_memory import HostMemory
from handlers.settings import HandlerSettings
from scripts.archive.reader import MarFile


def load_core(archive: Path) -> InferenceCore:
    """The core as TorchServe would build it from this .mar: its model-config.yaml and model file.

    The handler code is this checkout's `handlers` package, the same source the archive was built from. The
    archive must match the sha256 recorded next to it (DigestMismatch otherwise), as TorchServe's do: every path
    that loads an archive (in-process and Ray batch jobs, the image) serves only what `make archive` built.
    """
    mar = MarFile(archive)
    mar.verify_digest()
    settings = mar.settings()
    device = select_device(0 if torch.cuda.is_available() else None)
    with mar.unpacked() as folder:
        # The model file is read fully into memory here, so the unpacked folder can go afterwards.
        return InferenceCore.load(folder, settings, device)


def malloc_as_lane(archive: Path, lane: str) -> HostMemory:
    """This process's glibc malloc set as a TorchServe worker of `lane` sets its own: the archive's
    handler.mmap_threshold_mib and heap_slack_mib for that lane (handlers/host_memory.py; a lane the file does not name gets its
    `default`). Only the malloc setting follows `lane`: a core keeps the `default` entries of the rest (load_core).
    For the whole process, from now on. `python -m scripts.bench.batch` runs the pipeline ceiling (and so the
    in-process jobs after it) under digits-bulk's setting: with glibc's own adaptive threshold the core alone ran at
    one of two speeds from run to run, as its passes were or were not faulted in again (docs/batch-jobs.md)."""
    settings = HandlerSettings.from_yaml(MarFile(archive).model_config(), lane)
    return HostMemory.for_this_process(settings.mmap_threshold_bytes(lane), settings.heap_slack_bytes(lane))
