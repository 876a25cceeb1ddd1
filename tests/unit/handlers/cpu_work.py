"""Work that runs on the calling thread's CPU, for the yield's tests: a background pass is timed in its thread's own
run time (handlers/yielding.py pass_cpu_s), in which a sleep takes nothing."""

from __future__ import annotations

import time


def run_for(seconds: float) -> None:
    """Keeps the calling thread running until it has had `seconds` of CPU time (holding the GIL, as an operator's
    Python does)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
