"""A lane's own time limit per batch (handler.response_timeout_s): the worker ends itself when a batch runs past it.

TorchServe 0.12 takes responseTimeout from the archive's model-config.yaml for every lane registered from it, so
the stream lane would wait as long for a hung request as a bulk chunk may take. A watch thread of the worker
compares the running batch's age with the lane's limit; past it, the worker logs why and exits, and TorchServe
answers every request of that batch 500 "Worker died." at once and starts another worker, as it does itself
when responseTimeout runs out. The thread looks twice a second, so the error comes within the limit plus 0.5 s.

A background lane on the CPU counts only the time its worker actually ran (`run_seconds`: the process's CPU time
over the CPUs it computes on), not the wall clock: at SCHED_IDLE beside stream lanes that keep every core busy it
gets a fraction of a percent of a core, so a chunk that takes a second alone may take many minutes, and a wall-clock
limit would fail it (and its retry, again) for being starved (docs/priority.md, "Slowed, never failed"). A worker
that loops counts against the limit as before; one hung without running is left to TorchServe's responseTimeout,
the archive's wall-clock backstop of hours.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

POLL_S = 0.5
# The worker's exit status when it ends a batch that ran too long (TorchServe's answer is 500 for any status
# but 137, which it reports as 507, out of resources).
EXIT_STATUS = 3


def run_seconds(cpus: int) -> Callable[[], float]:
    """A clock of the seconds this process actually ran: its CPU time (every thread's) over the `cpus` it computes
    on, so that a batch keeping them busy counts as the wall clock does, and one kept waiting for them does not."""
    cpus = max(1, cpus)
    return lambda: time.process_time() / cpus


class LaneTimeout:
    """Started once per worker; `running()` marks a batch's start, `done()` its end. `clock`: time.monotonic, or
    run_seconds() for a lane whose batches may wait for the CPU without failing for it."""

    def __init__(self, lane: str, timeout_s: float, poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.lane = lane
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.clock = clock
        self.counts = "wall-clock" if clock is time.monotonic else "run"
        self._started: float | None = None
        self._requests = 0
        self._thread = threading.Thread(target=self._watch, name=f"{lane}-timeout", daemon=True)
        self._thread.start()

    @classmethod
    def for_lane(cls, lane: str, timeout_s: float, background_on_cpu: bool, cpus: int) -> LaneTimeout:
        """A background lane on the CPU counts the seconds its worker ran on its `cpus`; any other the wall clock
        (on a GPU a background lane waits for the stream lanes at most 50 ms a pass, handlers/yielding.py)."""
        return cls(lane, timeout_s, clock=run_seconds(cpus) if background_on_cpu else time.monotonic)

    def running(self, requests: int) -> None:
        self._requests = requests
        self._started = self.clock()

    def done(self) -> None:
        self._started = None

    def overdue(self, now: float) -> bool:
        started = self._started
        return started is not None and now - started > self.timeout_s

    def _watch(self) -> None:
        while True:
            time.sleep(self.poll_s)
            if self.overdue(self.clock()):
                self._expire()

    def _expire(self) -> None:
        logger.error(
            "lane %s: a batch of %d request(s) ran past handler.response_timeout_s=%s s (%s time); ending this worker "
            "so TorchServe answers them 500 and starts another",
            self.lane,
            self._requests,
            self.timeout_s,
            self.counts,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_STATUS)
