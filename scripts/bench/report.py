"""docs/benchmarks.md is shared by several benchmarks: each owns one marked section and rewrites only it."""

from __future__ import annotations

import os
import platform
import re

import torch

from scripts.layout import ROOT

REPORT = ROOT / "docs" / "benchmarks.md"


def machine() -> str:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU used"
    torch_version = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    return f"{platform.machine()}, {os.cpu_count()} CPU cores visible, {torch_version}, {device}"


def replace_section(name: str, body: str) -> None:
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    section = f"{begin}\n{body.rstrip()}\n{end}"
    existing = REPORT.read_text() if REPORT.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
    updated = pattern.sub(lambda _: section, existing) if pattern.search(existing) else existing.rstrip("\n") + "\n\n" + section
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(updated.rstrip("\n") + "\n")
