"""Markers come from the folder: tests/unit -> unit, tests/integration -> integration."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scripts.layout import ROOT


def pytest_collection_modifyitems(items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts[0] in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Each test starts at this process's torch thread count: a handler's initialize() sets it as it would a worker's,
    and a test that ran after one at 1 thread once passed only because of that (results differ by thread count on
    some CPUs)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
