"""A lane's share of the CPU (handler.priority): background work runs every thread of its process at SCHED_IDLE.

Linux runs a SCHED_IDLE thread only on a core no normal thread wants, and a normal thread that wakes preempts it
at once: the bulk lanes and batch jobs take what the stream lanes leave, and all of it when they are idle. The
policy is per thread: the process's threads that exist are switched one by one, and every thread started later
inherits its creator's policy. Lowering one's own priority needs no privilege (a non-root container keeps it).

Where the kernel groups tasks by session (autogroup: sched_autogroup_enabled, tasks in the root cgroup), the policy
orders threads only within their session, and sessions share the CPU as equals. A TorchServe's lanes share one
session, so its bulk lanes yield to its stream lanes; a background process that leads a session of its own (a job
started with `setsid`, by a service, by the bench) also sets its session's nice to 19, so it yields to the others.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from handlers.errors import SettingsError

INTERACTIVE = "interactive"
BACKGROUND = "background"
PRIORITIES = (INTERACTIVE, BACKGROUND)
# Lanes named like this are background unless handler.priority says otherwise (docs/architecture.md §4a).
BULK_SUFFIX = "-bulk"
DEFAULT_LANE = "default"
# The field of /proc/<pid>/task/<tid>/stat that holds the thread's scheduling policy (proc(5), counted from 1).
POLICY_FIELD = 41
AUTOGROUP = Path("/proc/self/autogroup")
AUTOGROUP_NICE = "19"
# OpenMP's threads wait for work by sleeping, not spinning: libgomp reads this once when it is loaded, which in a
# TorchServe worker is before any handler code runs, so it comes from the server's environment (handled there).
OMP_WAIT_POLICY = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"
# ...after a short spin: libgomp's spins before a waiting thread sleeps (PASSIVE alone: none; unset: 300,000). A
# 2-thread bulk pass meets a barrier per op, and waking a sleeping thread at each cost a minilm-bulk pass 11%
# (86.3 vs 97.3 rows/s with libgomp's default, processes taking turns); with 100,000 spins 94.1. A spinning thread
# is at SCHED_IDLE: the stream lanes' threads preempt it as they wake.
GOMP_SPINCOUNT = "GOMP_SPINCOUNT"
SPIN_GRACE = "100000"

PerLanePriority = str | Mapping[str, str | None] | None


def default_priority(lane: str | None) -> str:
    return BACKGROUND if lane and lane.endswith(BULK_SUFFIX) else INTERACTIVE


def check_priority(value: PerLanePriority) -> None:
    """Refuse anything but interactive/background, as one value or {lane: value, default: value}."""
    named = value.items() if isinstance(value, Mapping) else [(None, value)]
    for lane, priority in named:
        if priority is None or priority in PRIORITIES:
            continue
        where = f" for lane {lane}" if lane else ""
        raise SettingsError(
            f"handler.priority must be {INTERACTIVE} or {BACKGROUND}, got {priority!r}{where}; write e.g. "
            f"`priority: {{default: {INTERACTIVE}, digits-bulk: {BACKGROUND}}}` (lanes named *{BULK_SUFFIX} are "
            f"{BACKGROUND} and the others {INTERACTIVE} when the setting is left out)"
        )


def priority_for(value: PerLanePriority, lane: str | None) -> str:
    """The priority of `lane`: its own entry, else `default`, else the lane's name decides (bulk: background)."""
    if isinstance(value, Mapping):
        chosen = value.get(lane) if lane is not None else None
        chosen = chosen or value.get(DEFAULT_LANE)
    else:
        chosen = value
    return chosen or default_priority(lane)


def enter_background() -> int:
    """Every thread of this process at SCHED_IDLE, and so every thread it starts later. Returns how many were set."""
    idle = os.sched_param(0)
    os.sched_setscheduler(0, os.SCHED_IDLE, idle)  # the calling thread first: what it starts from now on inherits it
    switched = 1
    for tid in _threads("self"):
        if tid == _own_tid():
            continue
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, idle)
            switched += 1
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    lower_own_session()
    return switched


def lower_own_session() -> bool:
    """nice 19 for this process's autogroup when it leads its session (so the group is its own); False otherwise."""
    if os.getsid(0) != os.getpid():
        return False
    try:
        # Empty where the kernel does not group this process by session (a cpu cgroup of its own: a container).
        if not AUTOGROUP.read_text().strip():
            return False
        AUTOGROUP.write_text(AUTOGROUP_NICE)
    except OSError:  # no autogroup support, or a kernel that refuses
        return False
    return True


def apply_priority(priority: str) -> int:
    """Enter `priority` for this process; returns the threads switched (0 for interactive, which changes nothing)."""
    return enter_background() if priority == BACKGROUND else 0


def thread_policies(pid: int | str = "self") -> dict[int, int]:
    """{thread id: scheduling policy} of process `pid`, read from /proc (os.SCHED_IDLE is 5, SCHED_OTHER 0)."""
    policies = {}
    for tid in _threads(pid):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces; the fields after it start at 3
        policies[tid] = int(fields[POLICY_FIELD - 3])
    return policies


def waits_passively(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(OMP_WAIT_POLICY, "").upper() == PASSIVE


def _threads(pid: int | str) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def _own_tid() -> int:
    return threading.get_native_id()
