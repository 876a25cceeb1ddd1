"""handlers/cpu_quota.py reads a pod's CPU limit from cgroup files laid out as the kernel writes them."""

from __future__ import annotations

import os

import pytest

from handlers.cpu_quota import cgroup_cpus, usable_cpus


@pytest.mark.parametrize(
    ("content", "cpus"),
    [("max 100000\n", None), ("400000 100000\n", 4), ("150000 100000\n", 2), ("50000 100000\n", 1), ("2000 1000\n", 2)],
)
def test_cgroup_v2_cpu_max(tmp_path, content, cpus):
    (tmp_path / "cpu.max").write_text(content)
    assert cgroup_cpus(tmp_path) == cpus


@pytest.mark.parametrize(("quota", "cpus"), [("-1", None), ("300000", 3), ("250000", 3)])
def test_cgroup_v1_cfs_quota(tmp_path, quota, cpus):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(quota + "\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(tmp_path) == cpus


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cgroup_cpus(tmp_path) is None
    assert usable_cpus(tmp_path) == len(os.sched_getaffinity(0))


def test_the_quota_caps_the_cores_this_process_may_run_on(tmp_path):
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert usable_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{100000 * (len(os.sched_getaffinity(0)) + 8)} 100000\n")
    assert usable_cpus(tmp_path) == len(os.sched_getaffinity(0))
