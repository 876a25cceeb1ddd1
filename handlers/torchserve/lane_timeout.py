"""A lane's own time limit per batch (handler.response_timeout_s): the worker ends itself when a batch runs past it.

TorchServe 0.12 takes responseTimeout from the archive's model-config.yaml for every lane registered from it, so
the stream lane would wait as long for a hung request as a bulk chunk may take. A watch thread of the worker
compares the running batch's age with the lane's limit; past it, the worker logs why and exits, and TorchServe
answers every request of that batch 500 "Worker died." at once and starts another worker, as it does itself
when responseTimeout runs out. The thread looks twice a second, so the error comes within the limit plus 0.5 s.

A background lane on the CPU counts only the time its worker actually ran (RunClock: the most CPU time any one of
its threads has had since the batch started), not the wall clock: at SCHED_IDLE beside stream lanes that keep every
core busy it gets a fraction of a percent of a core, so a chunk that takes a second alone may take many minutes, and a
wall-clock limit would fail it (and its retry, again) for being starved (docs/priority.md, "Slowed, never failed").
A forward that loops, on one thread or on all, counts against the limit as on the wall clock; a worker hung without
running (a deadlock) is left to TorchServe's responseTimeout, the archive's wall-clock backstop of hours.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

POLL_S = 0.5
# The worker's exit status when it ends a batch that ran too long (TorchServe's answer is 500 for any status
# but 137, which it reports as 507, out of resources).
EXIT_STATUS = 3


class WallClock:
    """Seconds on the wall clock since a mark."""

    counts = "wall-clock"

    def mark(self) -> float:
        return time.monotonic()

    def since(self, mark: float) -> float:
        return time.monotonic() - mark


class RunClock:
    """Seconds run since a mark: the most CPU time any one thread of this process has had since then
    (/proc/self/task/*/stat, user and system). A batch that keeps a thread busy counts as the wall clock does, on one
    thread or on every one, and a batch whose threads wait for a CPU counts only what they got."""

    counts = "run"

    def __init__(self, task_dir: str = "/proc/self/task") -> None:
        self.task_dir = task_dir
        self.tick_s = 1 / os.sysconf("SC_CLK_TCK")

    def mark(self) -> dict[str, float]:
        return self._threads()

    def since(self, mark: dict[str, float]) -> float:
        # A thread started after the mark has run all of its CPU time since.
        return max((cpu - mark.get(tid, 0.0) for tid, cpu in self._threads().items()), default=0.0)

    def _threads(self) -> dict[str, float]:
        seconds = {}
        for tid in os.listdir(self.task_dir):
            try:
                with open(f"{self.task_dir}/{tid}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # the thread ended
            seconds[tid] = (int(fields[11]) + int(fields[12])) * self.tick_s  # utime, stime (fields 14, 15)
        return seconds


class LaneTimeout:
    """Started once per worker; `running()` marks a batch's start, `done()` its end. `clock`: WallClock, or RunClock
    for a lane whose batches may wait for the CPU without failing for it."""

    def __init__(self, lane: str, timeout_s: float, poll_s: float = POLL_S, clock: WallClock | RunClock | None = None) -> None:
        self.lane = lane
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.clock = clock or WallClock()
        self._started: Any = None
        self._requests = 0
        self._thread = threading.Thread(target=self._watch, name=f"{lane}-timeout", daemon=True)
        self._thread.start()

    @classmethod
    def for_lane(cls, lane: str, timeout_s: float, background_on_cpu: bool) -> LaneTimeout:
        """A background lane on the CPU counts the seconds its worker ran; any other the wall clock (on a GPU a
        background lane waits for the stream lanes at most 50 ms a pass, handlers/yielding.py)."""
        return cls(lane, timeout_s, clock=RunClock() if background_on_cpu else WallClock())

    def running(self, requests: int) -> None:
        self._requests = requests
        self._started = self.clock.mark()

    def done(self) -> None:
        self._started = None

    def overdue(self) -> bool:
        started = self._started
        return started is not None and self.clock.since(started) > self.timeout_s

    def _watch(self) -> None:
        while True:
            time.sleep(self.poll_s)
            if self.overdue():
                self._expire()

    def _expire(self) -> None:
        logger.error(
            "lane %s: a batch of %d request(s) ran past handler.response_timeout_s=%s s (%s time); ending this worker "
            "so TorchServe answers them 500 and starts another",
            self.lane,
            self._requests,
            self.timeout_s,
            self.clock.counts,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_STATUS)
