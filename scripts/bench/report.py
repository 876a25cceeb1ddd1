"""docs/benchmarks.md is shared by several benchmarks: each owns one marked section and rewrites only it."""

from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path

import torch

from scripts.layout import ROOT

REPORT = ROOT / "docs" / "benchmarks.md"
# The goals each benchmark checks its figures against, one data file for all of them.
TARGETS = json.loads(Path(__file__).with_name("targets.json").read_text())


def percentile(values, q: float) -> float:
    """The nearest-rank `q` quantile of `values` (NaN when there are none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine() -> str:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU used"
    torch_version = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    return f"{platform.machine()}, {os.cpu_count()} CPU cores visible, {torch_version}, {device}"


def replace_section(name: str, body: str, report: Path = REPORT, after: tuple[str, ...] = ()) -> None:
    """Rewrite the region between `<!-- name: begin -->` and `<!-- name: end -->` of `report`; the hand-written text
    around the marked regions is kept as it is. A region not there yet goes right after the last region of `after`
    that is (in that order of preference: the last one first), else at the end."""
    begin, end = _markers(name)
    section = f"{begin}\n{body.rstrip()}\n{end}"
    existing = report.read_text() if report.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
    if pattern.search(existing):
        updated = pattern.sub(lambda _: section, existing)
    else:
        anchor = next((_markers(other)[1] for other in reversed(after) if _markers(other)[1] in existing), None)
        if anchor is None:
            updated = existing.rstrip("\n") + "\n\n" + section
        else:
            cut = existing.index(anchor) + len(anchor)
            updated = existing[:cut] + "\n\n" + section + existing[cut:]
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(updated.rstrip("\n") + "\n")


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
