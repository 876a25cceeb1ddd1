"""Markers come from the folder: tests/unit -> unit, tests/integration -> integration."""

from __future__ import annotations

import contextlib
import os
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


@pytest.fixture(autouse=True)
def _normal_priority_restored():
    """Each test starts with this process's threads at the normal policy: code under test that runs a background
    lane or a batch job in this process (an in-process `batch_job.main`, a bulk lane's handler) puts every thread
    at SCHED_IDLE, as it would its own process, and a later test would run, and start children, at idle priority.
    Leaving SCHED_IDLE needs root (or RLIMIT_NICE) on Linux; elsewhere the threads stay where they are."""
    yield
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            if os.sched_getscheduler(int(tid)) == os.SCHED_IDLE:
                os.sched_setscheduler(int(tid), os.SCHED_OTHER, os.sched_param(0))
