"""A lane's priority on a GPU: the CUDA stream its passes run on, and its MPS client priority.

Processes sharing one GPU are time-sliced by the driver, whatever their streams say; under NVIDIA MPS (CUDA 12.2 and
later) each client has a priority read from CUDA_MPS_CLIENT_PRIORITY when its CUDA context is made (0 normal, 1 below
normal), and kernels of higher-priority streams are scheduled first. A background lane sets both before its first
CUDA call (the top of initialize()); without an MPS daemon the variable is read by nobody. Unmeasured on a GPU here.
"""

from __future__ import annotations

import os

import torch

from handlers.priority import BACKGROUND

MPS_CLIENT_PRIORITY = "CUDA_MPS_CLIENT_PRIORITY"
MPS_BELOW_NORMAL = "1"
# torch's stream priorities: 0 is the default and the lowest, negative numbers are higher.
HIGH_STREAM_PRIORITY = -1


def mps_environment(priority: str) -> dict[str, str]:
    """What a worker of `priority` puts in its environment before CUDA starts: bulk clients below normal."""
    return {MPS_CLIENT_PRIORITY: MPS_BELOW_NORMAL} if priority == BACKGROUND else {}


def enter_device_priority(device: torch.device, priority: str) -> torch.cuda.Stream | None:
    """On CUDA, a stream of the lane's priority made current for this thread (the one that runs the passes there);
    None on any other device."""
    if device.type != "cuda":
        return None
    stream = torch.cuda.Stream(device, priority=0 if priority == BACKGROUND else HIGH_STREAM_PRIORITY)
    torch.cuda.set_stream(stream)
    return stream


def set_mps_priority(priority: str) -> None:
    for name, value in mps_environment(priority).items():
        os.environ.setdefault(name, value)
