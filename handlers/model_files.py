"""Loading exported models without pickle: torch.export programs (.pt2) and TorchScript (.pt/.ts)."""
from __future__ import annotations

from pathlib import Path

import torch


def load_program(path: Path, device: torch.device) -> torch.nn.Module:
    """A callable module on `device` from a torch.export (.pt2) or TorchScript (.pt, .ts) file."""
    if not path.is_file():
        raise FileNotFoundError(f"model file {path} not found in the archive")
    if path.suffix == ".pt2":
        module = torch.export.load(str(path)).module()
        module.to(device)
        return module
    if path.suffix in (".pt", ".ts"):
        module = torch.jit.load(str(path), map_location=device)
        module.eval()
        return module
    raise ValueError(f"unsupported model file {path.name}: expected .pt2 (torch.export) or .pt/.ts (TorchScript)")
