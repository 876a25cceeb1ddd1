"""The stream lane's waits for a core from the scheduler's events (scripts/bench/core_waits.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from scripts.bench import core_waits
from scripts.bench.beside import ModelResult, waits_lines
from scripts.bench.core_waits import Waits, waits_in

# `perf sched timehist` as this machine's perf prints it (2026-12-08): a stream worker 300, a frontend 200 (threads
# 201, 202), a bulk worker 400 (thread 401) and the job's process 500; other tasks and the idle task between them.
TIMEHIST = """\
           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
   81758.789153 [0000]  perf[28018]                         0.000      0.000      0.000
   81758.791000 [0000]  python[401/400]                     0.000      0.000      5.000
   81758.792000 [0000]  python[300]                         1.000      0.800      0.500
   81758.793000 [0001]  <idle>                              0.000      0.000      0.400
   81758.794000 [0001]  epollEventLoopG[201/200]            2.000      0.010      0.100
   81758.795000 [0001]  C2 CompilerThre[202/200]            0.000      0.300      0.600
   81758.796000 [0001]  python[500]                         0.000      0.000      2.000
   81758.797000 [0001]  python[300]                         0.200      1.700      0.300
   81758.798000 [0000]  :-1[-1/400]                         0.000      0.000      0.100
   81758.799000 [0000]  epollEventLoopG[201/200]            0.400      0.050      0.100
"""


def test_each_switch_of_a_stream_thread_counts_and_those_onto_a_core_a_background_thread_left_are_apart():
    waits = waits_in(TIMEHIST, stream={300, 200}, background={400, 500})
    # Every line of pid 300 or 200, in order; the frontend's threads count as the lane's.
    assert waits.all_ms == [0.8, 0.01, 0.3, 1.7, 0.05]
    # 300 after the bulk worker's thread on core 0, 300 after the job's process on core 1, the frontend after a thread
    # of the bulk worker (an exited one, tid -1) on core 0; the frontend after the idle task or after itself is not.
    assert waits.after_background_ms == [0.8, 1.7, 0.05]


def test_a_thread_moved_to_the_core_after_it_became_runnable_waited_for_another_core_not_the_background_one():
    text = (
        "   81758.790000 [0000]  python[401/400]                     0.000      0.000      9.000\n"
        # 300 woke at .7900 (its wake-up placed it on core 1: a move at once), waited, and was pulled to core 0 at .7930
        "   81758.790000 [0001]  swapper[0]                                                migrated: python[300] cpu 0 => 1\n"
        "   81758.793000 [0000]  migration/0[18]                                           migrated: python[300] cpu 1 => 0\n"
        "   81758.794000 [0000]  python[300]                         1.000      3.500      0.500\n"
        # 301 woke on core 0 at .7945 (moved there as it woke) and waited behind the bulk thread itself
        "   81758.7945 [0000]  swapper[0]                                                  migrated: python[301] cpu 1 => 0\n"
        "   81758.795000 [0000]  python[401/400]                     0.000      0.000      0.500\n"
        "   81758.796000 [0000]  python[301]                         1.000      0.500      1.000\n"
    )
    waits = waits_in(text, stream={300, 301}, background={400})
    assert waits.all_ms == [3.5, 0.5]
    assert (waits.after_background_ms, waits.moved_in) == ([0.5], 1)


def test_headers_and_lines_of_another_shape_are_skipped():
    odd = "   81758.800000 [0000]  python[300]                         idle       n/a        n/a\n"
    text = "Samples do not have callchains.\n" + TIMEHIST + odd + "summary [0000] of 3 lines\n"
    assert waits_in(text, {300}, {400}).all_ms == [0.8, 1.7]


def test_a_recording_is_read_with_the_moves_between_cores(tmp_path, monkeypatch):
    """The moves (-M) are what tell a thread pulled from another core apart: read() asks timehist for them."""
    asked = []

    def timehist(command, **kwargs):
        asked.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=TIMEHIST, stderr="")

    monkeypatch.setattr(core_waits.subprocess, "run", timehist)
    waits = core_waits.read(tmp_path / "sched.data", [300], [400, 500])
    assert asked == [["perf", "sched", "timehist", "-M", "-i", str(tmp_path / "sched.data")]]
    assert waits.after_background_ms == [0.8, 1.7]


def test_the_section_shows_the_waits_per_closed_loop_and_checks_the_longest_from_the_bulk_side_against_1_ms():
    result = ModelResult("digits", 1000.0)
    result.waits[("c=1", "alone", "workers")] = Waits([0.1, 0.2, 3.0], [])
    result.waits[("c=1", "bulk lane job", "workers")] = Waits([0.1, 0.5, 0.9], [0.5, 0.9])
    result.waits[("c=4", "alone", "frontend")] = Waits([0.1], [])
    result.waits[("c=4", "bulk lane job", "frontend")] = Waits([0.1, 2.5], [2.5])
    text = "\n".join(waits_lines(result))
    assert "| c=1 | workers | 3.000 / 3.000 (3) | 0.900 / 0.900 (3) | 0.900 / 0.900 / 0.900 (2) | met |" in text
    assert "| c=4 | frontend | 0.100 / 0.100 (1) | 2.500 / 2.500 (2) | 2.500 / 2.500 / 2.500 (1) | missed |" in text
    result.waits[("c=4", "bulk lane job", "frontend")].moved_in = 3
    assert "| 2.500 / 2.500 / 2.500 (1); 3 moved in from another core left out | missed |" in "\n".join(waits_lines(result))
    result.waits_unavailable = "perf is not installed (Debian's linux-perf)"
    why = "perf is not installed (Debian's linux-perf)"
    assert waits_lines(result)[0] == f"The stream lane's waits for a core: not measured ({why})."


SPIN = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass\n"
SLEEP = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: time.sleep(0.001)\n"


@pytest.mark.skipif(core_waits.unavailable() is not None, reason=f"perf sched cannot record here: {core_waits.unavailable()}")
def test_a_recording_sees_a_normal_thread_that_waits_behind_idle_priority_spinners(tmp_path):
    """A real trace: a spinner per core at SCHED_IDLE for 3 s, and a normal process that sleeps 1 ms at a time as long;
    1 s recorded in the middle. The sleeper is put on a core many times, and some of those from a spinner."""
    idle = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    spinners = [subprocess.Popen([sys.executable, "-c", idle + SPIN]) for _ in range(os.cpu_count() or 1)]
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEP])
    path = tmp_path / "sched.data"
    try:
        time.sleep(0.7)  # every process started
        with core_waits.recording(path, 1.0) as recorded:
            time.sleep(1.0)
    finally:
        for process in (sleeper, *spinners):
            process.wait(timeout=30)
    assert recorded.error is None
    waits = core_waits.read(path, [sleeper.pid], [p.pid for p in spinners])
    assert len(waits.all_ms) >= 100
    assert 0 < len(waits.after_background_ms) <= len(waits.all_ms)
    assert all(w >= 0 for w in waits.all_ms)


@pytest.mark.skipif(core_waits.unavailable() is not None, reason=f"perf sched cannot record here: {core_waits.unavailable()}")
def test_a_recording_that_perf_cannot_write_says_why(tmp_path):
    with core_waits.recording(tmp_path / "no such folder" / "sched.data", 0.1) as recorded:
        time.sleep(0.1)
    assert recorded.error is not None and recorded.error.startswith("perf sched record exited ")
