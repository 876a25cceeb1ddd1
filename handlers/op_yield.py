"""Yield points between the operators of a background lane's forward pass on the CPU.

A pass of a bulk lane holds its core for as long as it computes, and one row of a classifier or an encoder already
takes tens of milliseconds on one thread. Cutting passes into fewer rows (handlers/yielding.py) cannot make them
shorter than a row, and small passes run at a fraction of full ones' speed. Between two operators, though, a pass can
stop at any point: this dispatch mode sees every aten operator a torch model runs (torch.export programs and
TorchScript alike), and between two of them, at most every CHECK_NS, asks its YieldingPasses whether a stream lane of
the device is busy; if so the thread yields its core (sched_yield) before the next operator. A pass with these points
holds the core at most one operator past the signal's rise; it has them while stream lanes are busy (and then is sized
so that its longest operator, not its whole time, fits the bound: a classifier's operators on one row take 0.1-2 ms,
its pass 30 ms) and while they served within the last second (handlers/yielding.py TRAFFIC_NS); a job with no stream
traffic around runs its full passes without them.

ONNX Runtime and AOTInductor run their operators outside torch's dispatcher: their passes are cut instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode

# How often, at most, the signal is read between operators: a check costs a few microseconds (64 slots read), an
# operator of these models tens to hundreds.
CHECK_NS = 100_000


class OperatorYield(TorchDispatchMode):
    """Calls `yield_point()` between operators once `check_ns` have passed since the last one; entered around one
    pass, on its thread. Keeps the longest stretch the pass ran without a yield point, in the thread's own run time
    (`run_ns`; a wait for the GIL or a core holds no core): what a stream batch that starts during it may wait, which
    bounds the pass's size while stream lanes are busy (handlers/yielding.py). The checks' spacing is on the wall
    clock, which costs a fifth of reading the thread's (0.18 against 0.9 µs here), read at checks only."""

    def __init__(
        self, yield_point: Callable[[], object], check_ns: int = CHECK_NS, run_ns: Callable[[], int] = time.thread_time_ns
    ) -> None:
        super().__init__()
        self.yield_point = yield_point
        self.check_ns = check_ns
        self.checks = 0
        self._run_ns = run_ns
        self._last_ns = time.perf_counter_ns()
        self._last_run_ns = run_ns()
        self._longest_ns = 0

    def __enter__(self):
        self._last_ns = time.perf_counter_ns()  # the pass starts computing now
        self._last_run_ns = self._run_ns()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        now = time.perf_counter_ns()
        if now - self._last_ns >= self.check_ns:
            ran = self._run_ns()
            self._longest_ns = max(self._longest_ns, ran - self._last_run_ns)
            self.checks += 1
            self.yield_point()
            self._last_ns = time.perf_counter_ns()
            self._last_run_ns = ran  # the yield's own few microseconds count in the next stretch
        return func(*args, **(kwargs or {}))

    def longest_stretch_s(self) -> float:
        """Seconds the thread ran in its longest stretch without a yield point so far, the one running now included."""
        return max(self._longest_ns, self._run_ns() - self._last_run_ns) / 1e9
