"""The CPUs this process may use: the cgroup's CPU quota (a Kubernetes pod's CPU limit), not the host's cores.

torch sizes its thread pool from the cores it sees (the host's, or the affinity mask), while a pod's CPU limit
is a quota in the cgroup: a bulk worker with a thread per host core on a 4-CPU pod of a 64-core node would be
throttled most of each period. Java 17 (TorchServe's frontend) reads the quota itself.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpus(root: Path = CGROUP) -> int | None:
    """CPUs the quota allows (rounded up, at least 1), or None when there is no quota (or no cgroup to read).

    cgroup v2: `cpu.max` holds "<quota> <period>" or "max <period>"; cgroup v1: `cpu/cpu.cfs_quota_us` (-1 for
    none) and `cpu/cpu.cfs_period_us`."""
    v2 = root / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().strip().partition(" ")
        return None if quota == "max" else _cpus(int(quota), int(period or 100_000))
    v1 = root / "cpu" / "cpu.cfs_quota_us"
    if v1.is_file():
        quota = int(v1.read_text())
        return None if quota < 0 else _cpus(quota, int((root / "cpu" / "cpu.cfs_period_us").read_text()))
    return None


def usable_cpus(root: Path = CGROUP) -> int:
    """The CPUs this process can run on (affinity), capped by the cgroup's quota."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_cpus(root)
    return cores if quota is None else min(cores, quota)


def _cpus(quota: int, period: int) -> int:
    return max(1, math.ceil(quota / period))
