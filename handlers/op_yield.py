"""Yield points between the operators of a background lane's forward pass on the CPU.

A pass of a bulk lane holds its core for as long as it computes, and one row of a classifier or an encoder already
takes tens of milliseconds on one thread. Cutting passes into fewer rows (handlers/yielding.py) cannot make them
shorter than a row, and small passes run at a fraction of full ones' speed. Between two operators, though, a pass can
stop at any point: at most every CHECK_NS it asks its YieldingPasses whether a stream lane of the device is busy; if
so the thread yields its core (sched_yield) before the next operator. A pass with these points holds the core at most
one operator past the signal's rise; it has them while stream lanes are busy (and then is sized so that its longest
operator, not its whole time, fits the bound: a classifier's operators on one row take 0.1-2 ms, its pass 30 ms) and
while they served within the last second (handlers/yielding.py TRAFFIC_NS); a job with no stream traffic around runs
its full passes without them.

Two ways to reach the points between operators:
- **In the graph** (GraphYield): a torch.export program is loaded as an FX graph (handlers/model_files.py), which
  gets a call to `point()` after each of its operators. In a process with no pass that asked for them (every stream
  worker) a point reads a module global and returns; in a bulk worker it reads a thread-local too.
- **A dispatch mode** (OperatorYield): sees every aten operator any torch model runs (TorchScript's too), at the cost
  of a Python call through the dispatcher for each one: digits' bounded passes of 16 rows, two threads, ran 10,300
  rows/s under the mode, 16,100 with the points in the graph and 16,000-18,800 with none (2026-12-07, in process).

ONNX Runtime and AOTInductor run their operators outside torch's dispatcher and graph: their passes are cut instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# How often, at most, the signal is read between operators: a check costs a few microseconds (64 slots read), an
# operator of these models tens to hundreds.
CHECK_NS = 100_000

_active = threading.local()  # .points: the GraphYield of the pass this thread runs, if it asked for points
_live = 0  # GraphYields entered in this process and not left: with none (every stream worker) a point reads only this
_live_lock = threading.Lock()


def point() -> None:
    """A yield point in an exported graph, after an operator: checks if this thread's pass asked for points."""
    if _live:
        points = getattr(_active, "points", None)
        if points is not None:
            points.check()


def add_points(graph: torch.fx.Graph) -> None:
    """A `point()` call after each torch operator of `graph`, in place. A higher-order operator's subgraph
    (torch.cond, an autocast region) gets none inside: it counts as one stretch (none of ours has one)."""
    for node in list(graph.nodes):
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            with graph.inserting_after(node):
                graph.call_function(point, ())


class _Stretches:
    """Calls `yield_point()` at a point between operators once `check_ns` have passed since the last check. Keeps
    the longest stretch the pass ran without a check, in the thread's own run time (`run_ns`; a wait for the GIL or a
    core holds no core): what a stream batch that starts during it may wait, which bounds the pass's size while
    stream lanes are busy (handlers/yielding.py). The checks' spacing is on the wall clock, which costs a fifth of
    reading the thread's (0.18 against 0.9 us here), read at checks only."""

    def __init__(
        self, yield_point: Callable[[], object], check_ns: int | None = None, run_ns: Callable[[], int] = time.thread_time_ns
    ) -> None:
        self.yield_point = yield_point
        self.check_ns = CHECK_NS if check_ns is None else check_ns  # read when made: tests may set it
        self.checks = 0
        self._run_ns = run_ns
        self._start()
        self._longest_ns = 0

    def _start(self) -> None:
        self._last_ns = time.perf_counter_ns()  # the pass starts computing now
        self._last_run_ns = self._run_ns()

    def check(self) -> None:
        now = time.perf_counter_ns()
        if now - self._last_ns >= self.check_ns:
            ran = self._run_ns()
            self._longest_ns = max(self._longest_ns, ran - self._last_run_ns)
            self.checks += 1
            self.yield_point()
            self._last_ns = time.perf_counter_ns()
            self._last_run_ns = ran  # the yield's own few microseconds count in the next stretch

    def longest_stretch_s(self) -> float:
        """Seconds the thread ran in its longest stretch without a yield point so far, the one running now included."""
        return max(self._longest_ns, self._run_ns() - self._last_run_ns) / 1e9


class GraphYield(_Stretches):
    """The points of an exported graph (add_points), made live on this thread around one pass."""

    def __enter__(self) -> GraphYield:
        global _live
        self._start()
        with _live_lock:
            _live += 1
        self._outer = getattr(_active, "points", None)
        _active.points = self
        return self

    def __exit__(self, *exc) -> None:
        global _live
        _active.points = self._outer
        with _live_lock:
            _live -= 1


class OperatorYield(_Stretches, TorchDispatchMode):
    """A yield point before every aten operator the thread runs (any torch model: TorchScript, eager, exported), by a
    dispatch mode entered around one pass."""

    def __init__(
        self, yield_point: Callable[[], object], check_ns: int | None = None, run_ns: Callable[[], int] = time.thread_time_ns
    ) -> None:
        TorchDispatchMode.__init__(self)
        _Stretches.__init__(self, yield_point, check_ns, run_ns)

    def __enter__(self):
        self._start()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.check()
        return func(*args, **(kwargs or {}))
