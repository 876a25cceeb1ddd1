"""Loading exported models without pickle: torch.export programs (.pt2) and TorchScript (.pt/.ts)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.export.passes import move_to_device_pass


def load_program(path: Path, device: torch.device) -> torch.nn.Module:
    """A callable module on `device` from a torch.export (.pt2) or TorchScript (.pt, .ts) file."""
    if not path.is_file():
        raise FileNotFoundError(f"model file {path} not found in the archive")
    if path.suffix == ".pt2":
        program = torch.export.load(str(path))
        if device.type != "cpu":
            # A graph keeps the device it was exported on in ops such as arange(device=...) and
            # to(device) (a BERT's attention mask has them); module.to() would move only the weights.
            program = move_to_device_pass(program, device)
        module = program.module()
        module.to(device)
        return module
    if path.suffix in (".pt", ".ts"):
        module = torch.jit.load(str(path), map_location=device)
        module.eval()
        return module
    raise ValueError(f"unsupported model file {path.name}: expected .pt2 (torch.export) or .pt/.ts (TorchScript)")
