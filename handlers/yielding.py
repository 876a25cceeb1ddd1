"""Cooperative yield of a background lane: short passes while a stream lane of the same device is busy.

The OS preempts a SCHED_IDLE thread on the CPU, but not a pass holding the GIL of a process, nor a kernel queued on
a GPU. While the stream lanes' signal is raised (handlers/lane_signal.py), and for `linger_s` after it last dropped,
the bulk core cuts its rows into passes expected to take at most `pass_s` (learned from the bounded passes so far,
timed on the CPU in what the pass thread ran: see pass_cpu_s) and yields between them: on the CPU it gives its core
to a waiting thread (sched_yield; back at once if none waits, so no core is left idle), at most once per pass_s of
the yielding thread's own CPU time, half that for a stream batch it has not yielded to yet (a yield costs the yielder
the rest of its time slice: see _ran_since_yield); on a GPU it waits until the signal drops, at most `max_wait_s` a
time, so a saturated stream lane slows a job but never starves it (one bounded pass every max_wait_s at least). With
no stream batch within the linger, a pass is full size.

On the CPU with several pass threads (`run_pulled`), each thread takes its next slice of rows itself, checks the
signal and yields on its own: no thread waits for another's pass at a barrier, which a stream thread that preempts
one of them would otherwise stretch for both.

Why linger and yield on the CPU at all, since the OS preempts an idle thread: a stream request spends most of its
time outside its worker's batch (the frontend, the socket, the client), and the next one starts a moment after. On
this 2-core VM a SCHED_IDLE loop that never enters the kernel cost a stream lane's p99 about 1.35x, the same loop
calling sched_yield every 0.7 ms next to nothing (docs/priority.md). Lingering buys that for the stream lane with the
job's rate: bounded passes run at a fraction of full ones' speed, so it is a lane setting (handler.yield_linger_ms,
0 by default; digits' bulk lane sets 20 ms, where a pass of a few rows is short; a minilm or classifier pass of one
row already takes milliseconds).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handlers.lane_signal import LaneSignal
from handlers.model_files import has_graph_points, runs_torch_operators
from handlers.op_yield import GraphYield, OperatorYield

CPU_PASS_S = 0.001
DEVICE_PASS_S = 0.002
MAX_WAIT_S = 0.05
WAIT_STEP_S = 0.0002
# The padded units a bounded pass may hold, learned as it runs: each bounded round's units scaled by pass_s over the
# time it took, in a moving average, so a change of row lengths is followed. Proportional, not per unit: a pass has a
# fixed cost (a digits pass of 1 row takes 0.2 ms, of 16 rows 0.9 ms, on one thread), which a cost per unit would
# charge to every row and so keep the passes at one row.
LEARNING = 0.3
# A pass thread yields to a stream batch that started since its last yield once it has run this share of pass_s since
# then; while the same batches run, once per pass_s. So a hold ends within half of pass_s of the thread's run and the
# stretch it is in, not a whole pass_s: digits' holds, timed as YieldStats says, p99 1.47-1.73 ms against 1.96-2.03
# spaced by pass_s (2026-12-07, in process); beside the stream lane the job ran 6,567 / 5,282 / 3,322 / 2,259 rows/s
# at c=1 / 4 / 16 / 50% against 6,254 / 5,745 / 3,705 / 2,657 spaced by pass_s, within this VM's spread and not shown
# to be a cost (scripts.bench.bulk_variants, 3 alternations, the job's commits counted from 0.7 s after a resume).
# Halving the spacing of every yield (and the passes) instead ran bounded passes at about half their rate
# (docs/priority.md, "Slowed, never failed": a yield costs the yielder its slice); a signal held up by the same
# batches brings no new ones, so this spacing costs those passes nothing.
FRESH_SPACING = 0.5
# A full pass gets yield points between its operators when a stream batch ended within this long (handlers/op_yield.py).
TRAFFIC_NS = 1_000_000_000
# A thread's CPU time (time actually run), read to space its yields on the CPU; a name of its own so tests can set it.
thread_cpu_s = time.thread_time
# The clock a pass's stretches are timed with on the CPU: the pass thread's own run time, as for the spacing, but a name
# of its own (tests tick the spacing's clock). A core is held only while its thread runs: a pass thread that waits for
# the GIL (two pass threads of one worker take turns at it between operators) or that a stream thread preempted holds
# none. Timed on the wall clock, those waits made bounded passes look long, and the rows a pass may hold shrank to
# one: digits' bulk core (two pass threads, in process, the signal held up) ran 1,600-2,000 rows/s in 1 ms passes,
# its full passes 21,700-23,700 (2026-12-07).
pass_cpu_s = time.thread_time
# The clock a hold is timed with on the CPU: the pass thread's run time again (a thread the stream lanes or its
# sibling's GIL keep waiting holds no core), a name of its own so tests that tick the spacing's clock leave it alone.
hold_cpu_s = time.thread_time


@dataclass
class YieldStats:
    """What the yielding cost and bounded, since the last `take()`: seconds spent yielding, passes cut short,
    and each observed hold: for each rise of the signal and each pass thread, how long the thread kept its core from
    the rise to its next yield point. On the CPU that is the thread's run time (an upper bound: counted from its last
    read of the signal before the rise); on a GPU the wall clock. Kept apart by what bounded it: a bounded pass or one
    operator (the signal was already up, or the pass had yield points between operators), or a whole full-size pass
    (it rose while the lane ran alone, without points)."""

    yielded_s: float = 0.0
    cut_passes: int = 0
    holds_s: list[float] = field(default_factory=list)  # seen after a bounded pass or between operators
    holds_after_full_s: list[float] = field(default_factory=list)  # seen at the end of a full-size pass

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
    @classmethod
    def for_lane(cls, signal: LaneSignal, settings: Any, full_rows: int, on_cpu: bool) -> YieldingPasses | None:
        """A background lane's (or in-process job's) yield from its handler settings; None where yield_pass_ms is 0.
        Between operators (handlers/op_yield.py) on the CPU where the model file runs torch's operators and
        handler.yield_between_operators is on; else by cutting passes."""
        pass_s = settings.yield_pass_s()
        pass_s = pass_s if pass_s is not None else default_pass_s(on_cpu)
        if not pass_s:
            return None
        model_file = Path(settings.model_file)
        between = on_cpu and settings.yield_between_operators and runs_torch_operators(model_file)
        in_graph = between and has_graph_points(model_file)
        linger_s = settings.yield_linger_s()
        return cls(signal, full_rows, on_cpu, pass_s, linger_s=linger_s, between_operators=between, points_in_graph=in_graph)

    def __init__(
        self,
        signal: LaneSignal,
        full_rows: int,
        on_cpu: bool,
        pass_s: float | None = None,
        max_wait_s: float = MAX_WAIT_S,
        linger_s: float = 0.0,
        between_operators: bool = False,
        points_in_graph: bool = False,
    ) -> None:
        self.signal = signal
        self.full_rows = full_rows  # rows of a full pass (of a round in run(): max_batch_rows x passes at once)
        self.on_cpu = on_cpu
        self.pass_s = pass_s if pass_s is not None else (CPU_PASS_S if on_cpu else DEVICE_PASS_S)
        self.max_wait_s = max_wait_s
        self.linger_ns = int(linger_s * 1e9)
        # Yield points between the pass's operators too (handlers/op_yield.py), near stream traffic: while stream
        # lanes are busy a pass is sized by its longest operator, not its whole time.
        self.between_operators = between_operators
        # Where those points are: in the model's graph (a torch.export program), else a dispatch mode's (op_yield.py).
        self.points_in_graph = points_in_graph
        self.units: float | None = None  # padded units (rows x the longest row's cost) a bounded pass may hold
        self.stats = YieldStats()
        # Per pass thread: its CPU time at its last yield (yielded_cpu_s); the rises it has yielded to (seen); its run
        # time at its last read of the signal (read_ran_s) and, for each raised slot, at the read before the thread
        # first saw it raised (first_ran_s): where the thread's hold of its core after that rise starts at the latest.
        self._thread = threading.local()
        self._lock = threading.Lock()  # the stats and what was learned, shared by run_pulled's threads

    def run(self, rows: Sequence[Any], cost: Callable[[Any], int], run: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """Results of `rows` in their order, `run` called on consecutive slices of them sorted by cost."""
        order = sorted(range(len(rows)), key=lambda i: cost(rows[i]))
        results: list[Any] = [None] * len(rows)
        cursor = _Cursor(len(order))
        self._work(order, rows, cost, run, results, cursor, self.full_rows)
        return results

    def run_pulled(
        self,
        rows: Sequence[Any],
        cost: Callable[[Any], int],
        run: Callable[[list[Any]], list[Any]],
        pool: Executor,
        threads: int,
        slice_rows: int,
    ) -> list[Any]:
        """As run(), with `threads` threads of `pool` each taking its next slice (full: `slice_rows`) as it is free."""
        order = sorted(range(len(rows)), key=lambda i: cost(rows[i]))
        results: list[Any] = [None] * len(rows)
        cursor = _Cursor(len(order))
        workers = [pool.submit(self._work, order, rows, cost, run, results, cursor, slice_rows) for _ in range(threads)]
        for worker in workers:
            worker.result()  # the first failure raises, once every thread has stopped taking slices
        return results

    def _work(self, order, rows, cost, run, results, cursor: _Cursor, full: int) -> None:
        last_bounded = False
        while not cursor.done():
            bounded = self._yield_if_busy(last_bounded)
            with self._lock:
                start = cursor.position
                remaining = order[start : start + full]
                count = self.bounded_rows(remaining, rows, cost) if bounded else len(remaining)
                self.stats.cut_passes += bounded and count < len(remaining)
                part = cursor.take(count)
            if not part:
                return
            part = order[part.start : part.stop]
            clock = pass_cpu_s if self.on_cpu else time.perf_counter  # a GPU's passes: the wall clock, kernels and all
            started = clock()
            points = self._points(self._yield_within_pass) if self._points_wanted(bounded) else None
            try:
                with points if points is not None else contextlib.nullcontext():
                    outputs = run([rows[i] for i in part])
            except BaseException:
                cursor.stop()  # the other threads take no more slices
                raise
            # What the bound limits: the longest stretch without a yield point, the whole pass when there are none.
            stretch = points.longest_stretch_s() if points is not None else clock() - started
            if bounded:  # learned from bounded passes only: their rows and time are the pass's own
                with self._lock:
                    self._learn(stretch, len(part) * max(1, cost(rows[part[-1]])))
            for i, result in zip(part, outputs, strict=True):
                results[i] = result
            last_bounded = bounded

    def bounded_rows(self, remaining: Sequence[int], rows: Sequence[Any], cost: Callable[[Any], int]) -> int:
        """Rows of the next pass expected to take at most pass_s: at least one, and one until a pass was timed."""
        if self.units is None:
            return 1
        count = 1
        limit = min(self.full_rows, len(remaining))
        # Rounded to the nearest row, not down: from one row that takes 0.6 of the bound (1.67 fit) it grows to two.
        while count < limit and (count + 0.5) * max(1, cost(rows[remaining[count]])) <= self.units:
            count += 1
        return count

    def _points(self, yield_point: Callable[[], None]) -> GraphYield | OperatorYield:
        return GraphYield(yield_point) if self.points_in_graph else OperatorYield(yield_point)

    def _points_wanted(self, bounded: bool) -> bool:
        """Yield points between operators for the next pass: while stream lanes are busy, and in a full pass while
        they served within the last TRAFFIC_NS (a rise during it is then seen at the next operator). A job with no
        stream traffic around runs without them: under the dispatch mode (TorchScript) their Python call per
        operator cost minilm's 2-thread passes of 16 rows about 10% (in process, alternated), and in an exported
        graph each check still reads the 64 slots."""
        if not self.between_operators:
            return False
        return bounded or self.signal.dropped_within(TRAFFIC_NS) or bool(self.signal.rises())

    def _yield_within_pass(self) -> None:
        """A yield point between two operators: yields once for each stream batch that started since this thread last
        yielded, not again while the same batches run. Once the core is given to a rise, yielding at every operator
        after it gives nothing to that batch and starves the job: a SCHED_IDLE thread that calls sched_yield every
        0.1 ms beside saturated stream lanes ran minilm's 32-row soak job past its 600 s response timeout (CI's make
        soak of 2026-12-06). Between passes and here alike, a thread on the CPU yields at most once per pass_s it ran,
        or half of it for a batch it has not yielded to (FRESH_SPACING). Each pass thread yields to a batch once: each
        holds a core of its own. A hold it sees is bounded by the operator before it, so it counts with those seen
        after a bounded pass (YieldStats.holds_s), whatever the pass's size."""
        rises = self._rises(True)
        seen = getattr(self._thread, "seen", ())
        if any(rose not in seen for rose in rises):
            self._yield_if_busy(True, rises)

    def _rises(self, last_bounded: bool) -> list[int]:
        """The raised slots' rise clocks. On the CPU notes, for this thread, its run time at the read before it first
        saw each (0, its whole run, at its first read), and counts the hold of each batch that ended before the
        thread yielded to it: the thread kept its core through that batch (up to this read)."""
        if not self.on_cpu:
            return self.signal.rises()
        ran = hold_cpu_s()  # before the signal: a batch that starts between the two reads is still counted from here
        rises = self.signal.rises()
        mine = self._thread
        before = getattr(mine, "read_ran_s", 0.0)
        first = getattr(mine, "first_ran_s", {})
        seen = getattr(mine, "seen", ())
        ended = [rose for rose in first if rose not in seen and rose not in rises]
        if ended:
            self._count(last_bounded, self._held(ended, first, ran))
        mine.first_ran_s = {rose: first.get(rose, before) for rose in rises}
        mine.read_ran_s = ran
        return rises

    def _yield_if_busy(self, last_bounded: bool, rises: list[int] | None = None) -> bool:
        """Whether the next pass is bounded: a stream batch running, or one ended within the linger. Yields if so."""
        rises = self._rises(last_bounded) if rises is None else rises
        if not rises and not (self.linger_ns and self.signal.dropped_within(self.linger_ns)):
            return False
        fresh = any(rose not in getattr(self._thread, "seen", ()) for rose in rises)
        if self.on_cpu and not self._ran_since_yield(self.pass_s * (FRESH_SPACING if fresh else 1.0)):
            return True  # bounded, but this thread yields once it has run long enough since its last yield
        if rises:
            self._count_holds(rises, last_bounded)
        started = time.perf_counter()
        if self.on_cpu:
            os.sched_yield()
        elif rises:
            deadline = started + self.max_wait_s
            while self.signal.raised_since() and time.perf_counter() < deadline:
                time.sleep(WAIT_STEP_S)
        with self._lock:
            self.stats.yielded_s += time.perf_counter() - started
        return True

    def _count_holds(self, rises: list[int], last_bounded: bool) -> None:
        """Each rise this thread has not yielded to yet: how long it kept its core since (YieldStats)."""
        mine = self._thread
        seen = getattr(mine, "seen", ())
        fresh = [rose for rose in rises if rose not in seen]
        if self.on_cpu:
            held = self._held(fresh, getattr(mine, "first_ran_s", {}), hold_cpu_s())
        else:
            now = time.monotonic_ns()
            held = [(now - rose) / 1e9 for rose in fresh]
        mine.seen = set(rises)  # only the raised ones: a slot's next rise has a later clock
        self._count(last_bounded, held)

    @staticmethod
    def _held(rises: list[int], first_ran_s: dict[int, float], ran: float) -> list[float]:
        """Seconds this thread ran since each rise, at most: since its read before the rise (0 if none), and never more
        than the wall clock since the rise."""
        now = time.monotonic_ns()
        return [min((now - rose) / 1e9, ran - first_ran_s.get(rose, 0.0)) for rose in rises]

    def _count(self, last_bounded: bool, held: list[float]) -> None:
        with self._lock:
            (self.stats.holds_s if last_bounded else self.stats.holds_after_full_s).extend(held)

    def _ran_since_yield(self, spacing_s: float) -> bool:
        """Whether this thread has run (CPU time) at least `spacing_s` since its last yield on the CPU; notes the yield
        if so. A yield gives up the rest of the thread's time slice, and under EEVDF (Linux 6.6 and later) moves its
        deadline a whole slice on, which for a SCHED_IDLE thread's weight is about 340 slices of a normal thread's:
        yielding after every 0.1 ms run, beside busy stream lanes, ran a process at idle priority at about half the
        rate it got not yielding (beside three normal-priority spinners on 2 cores, 2026-12-07), and a minilm bulk
        chunk past its lane's timeout in CI's soak. Spaced by what the thread ran, not by the wall clock, a thread
        the stream lanes keep waiting still runs between yields, and a hold stays within the spacing of its run and
        the stretch it is in."""
        now = thread_cpu_s()
        last = getattr(self._thread, "yielded_cpu_s", None)
        if last is not None and now - last < spacing_s:
            return False
        self._thread.yielded_cpu_s = now
        return True

    def _learn(self, seconds: float, units: int) -> None:
        fits = units * self.pass_s / max(seconds, 1e-6)
        self.units = fits if self.units is None else (1 - LEARNING) * self.units + LEARNING * fits


class _Cursor:
    """The next row (in cost order) not yet taken, shared by the threads taking slices."""

    def __init__(self, total: int) -> None:
        self.position = 0
        self.total = total

    def done(self) -> bool:
        return self.position >= self.total

    def take(self, count: int) -> range:
        taken = range(self.position, min(self.total, self.position + count))
        self.position = taken.stop
        return taken

    def stop(self) -> None:
        self.position = self.total
