"""Cooperative yield of a background lane: short passes while a stream lane of the same device is busy.

The OS preempts a SCHED_IDLE thread on the CPU, but not a pass holding the GIL of a process, nor a kernel queued on
a GPU. While the stream lanes' signal is raised (handlers/lane_signal.py), the bulk core cuts its rows into passes
expected to take at most `pass_s` (from the time a pass took per padded unit so far) and yields between them: on the
CPU it gives its core to a waiting thread (sched_yield; back at once if none waits, so no core is left idle), on a
GPU it waits until the signal drops, at most `max_wait_s` a time, so a saturated stream lane slows a job but never
starves it (one bounded pass every max_wait_s at least). Unraised, a pass is full size.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from handlers.lane_signal import LaneSignal

CPU_PASS_S = 0.001
DEVICE_PASS_S = 0.002
MAX_WAIT_S = 0.05
WAIT_STEP_S = 0.0002
# What a pass cost per padded unit, learned as it runs: a moving average, so a change of row lengths is followed.
LEARNING = 0.3


@dataclass
class YieldStats:
    """What the yielding cost and bounded, since the last `take()`: seconds spent yielding, passes cut short,
    and each observed hold (seconds from a signal's rise to this lane's next yield point), kept apart by the pass it
    rose during: a bounded one (the signal was already up) or a full one (it rose while the lane ran alone)."""

    yielded_s: float = 0.0
    cut_passes: int = 0
    holds_s: list[float] = field(default_factory=list)  # rose during a bounded pass
    holds_after_full_s: list[float] = field(default_factory=list)  # rose during a full-size pass

    def take(self) -> YieldStats:
        taken = YieldStats(self.yielded_s, self.cut_passes, self.holds_s, self.holds_after_full_s)
        self.yielded_s, self.cut_passes, self.holds_s, self.holds_after_full_s = 0.0, 0, [], []
        return taken


def default_pass_s(on_cpu: bool) -> float:
    """A background lane's pass bound when handler.yield_pass_ms is left out: CPU_PASS_S on the CPU, DEVICE_PASS_S on a
    GPU. On the CPU the OS preempts the idle-priority worker anyway; the frontend, which carries the bulk lane's
    requests and answers at normal priority, does not yield, and cutting slows it with the lane: the stream lanes'
    p50 stayed within 1.1x at 1 to 16 connections cutting, 1.6x not (docs/decisions.md)."""
    return CPU_PASS_S if on_cpu else DEVICE_PASS_S


class YieldingPasses:
    def __init__(
        self,
        signal: LaneSignal,
        full_rows: int,
        on_cpu: bool,
        pass_s: float | None = None,
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        self.signal = signal
        self.full_rows = full_rows  # rows of a round at full size (max_batch_rows x passes at once)
        self.on_cpu = on_cpu
        self.pass_s = pass_s if pass_s is not None else (CPU_PASS_S if on_cpu else DEVICE_PASS_S)
        self.max_wait_s = max_wait_s
        self.unit_s: float | None = None  # seconds per padded unit (rows x the longest row's cost) of a pass
        self.stats = YieldStats()
        self._seen_rises: set[int] = set()
        self._last_bounded = False

    def run(self, rows: Sequence[Any], cost: Callable[[Any], int], run: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """Results of `rows` in their order, `run` called on consecutive slices of them sorted by cost."""
        order = sorted(range(len(rows)), key=lambda i: cost(rows[i]))
        results: list[Any] = [None] * len(rows)
        start = 0
        while start < len(order):
            bounded = self._last_bounded = self._yield_if_raised()
            count = self.bounded_rows(order[start:], rows, cost) if bounded else self.full_rows
            self.stats.cut_passes += bounded and count < min(self.full_rows, len(order) - start)
            part = order[start : start + count]
            started = time.perf_counter()
            outputs = run([rows[i] for i in part])
            if bounded:  # learned from bounded passes only: a full round runs several passes at once, a short one not
                self._learn(time.perf_counter() - started, len(part) * max(1, cost(rows[part[-1]])))
            for i, result in zip(part, outputs, strict=True):
                results[i] = result
            start += len(part)
        return results

    def bounded_rows(self, remaining: Sequence[int], rows: Sequence[Any], cost: Callable[[Any], int]) -> int:
        """Rows of the next pass expected to take at most pass_s: at least one, and one until a pass was timed."""
        if self.unit_s is None:
            return 1
        count = 1
        limit = min(self.full_rows, len(remaining))
        while count < limit and (count + 1) * max(1, cost(rows[remaining[count]])) * self.unit_s <= self.pass_s:
            count += 1
        return count

    def _yield_if_raised(self) -> bool:
        rises = self.signal.rises()
        if not rises:
            return False
        now = time.monotonic_ns()
        holds = self.stats.holds_s if self._last_bounded else self.stats.holds_after_full_s
        holds.extend((now - rose) / 1e9 for rose in rises if rose not in self._seen_rises)
        self._seen_rises = set(rises)  # only the raised ones: a slot's next rise has a later clock
        started = time.perf_counter()
        if self.on_cpu:
            os.sched_yield()
        else:
            deadline = started + self.max_wait_s
            while self.signal.raised_since() and time.perf_counter() < deadline:
                time.sleep(WAIT_STEP_S)
        self.stats.yielded_s += time.perf_counter() - started
        return True

    def _learn(self, seconds: float, units: int) -> None:
        per_unit = seconds / units
        self.unit_s = per_unit if self.unit_s is None else (1 - LEARNING) * self.unit_s + LEARNING * per_unit
