"""handlers/torchserve/lane_timeout.py in a real process: a batch past the lane's limit ends the worker with a log line
saying why; a batch that ends in time does not; a lane counting run time ignores time its batch did not run."""

from __future__ import annotations

import subprocess
import sys
import time

from handlers.torchserve.lane_timeout import EXIT_STATUS
from scripts.layout import ROOT

PROGRAM = """
import logging, sys, time
from handlers.torchserve.lane_timeout import LaneTimeout
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
timeout = LaneTimeout.for_lane("digits", {timeout}, background_on_cpu={run_time})
timeout.poll_s = 0.05
timeout.running(3)
end = time.monotonic() + {batch}
while time.monotonic() < end:
    {work}
timeout.done()
time.sleep(0.5)
print("answered")
"""
SLEEPS = "time.sleep(0.01)"  # waiting, as a batch that does not get the CPU does
SPINS = "pass"


def run(timeout: float, batch: float, run_time: bool = False, work: str = SLEEPS) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    code = PROGRAM.format(timeout=timeout, batch=batch, run_time=run_time, work=work)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


def test_a_batch_past_the_lanes_timeout_ends_the_worker_within_the_timeout_and_a_poll():
    done, seconds = run(timeout=0.5, batch=30)
    assert done.returncode == EXIT_STATUS
    assert "answered" not in done.stdout
    assert "lane digits: a batch of 3 request(s) ran past handler.response_timeout_s=0.5 s (wall-clock time)" in done.stderr
    assert seconds < 10  # the batch would have taken 30 s


def test_a_batch_within_the_timeout_is_left_alone():
    done, _ = run(timeout=2, batch=0.1)
    assert (done.returncode, done.stdout.strip()) == (0, "answered")


def test_a_lane_counting_run_time_leaves_a_batch_that_waits_past_its_limit_alone():
    """A background lane on the CPU: a batch kept waiting (here asleep, using no CPU) for three times its limit is
    not cut; starved at idle priority, it is slowed, not failed."""
    done, seconds = run(timeout=0.5, batch=1.5, run_time=True, work=SLEEPS)
    assert (done.returncode, done.stdout.strip()) == (0, "answered")
    assert "ran past" not in done.stderr and seconds < 20


def test_a_lane_counting_run_time_cuts_a_batch_that_runs_past_its_limit():
    done, seconds = run(timeout=0.5, batch=30, run_time=True, work=SPINS)
    assert done.returncode == EXIT_STATUS
    assert "lane digits: a batch of 3 request(s) ran past handler.response_timeout_s=0.5 s (run time)" in done.stderr
    assert seconds < 20  # the batch would have spun for 30 s


def test_the_run_clock_counts_the_busiest_threads_cpu_time_not_their_sum_nor_the_wall_clock():
    """Two threads each running 0.3 s of CPU time read as 0.3 s run (a forward on every thread counts as the wall
    clock would); a second asleep after them adds nothing."""
    import threading

    from handlers.torchserve.lane_timeout import RunClock

    done = threading.Event()
    spun = threading.Barrier(3)

    def spin(seconds: float) -> None:  # then stays, as a worker's pass threads do between batches
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        spun.wait()
        done.wait()

    clock = RunClock()
    mark = clock.mark()
    threads = [threading.Thread(target=spin, args=(0.3,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    spun.wait()
    ran = clock.since(mark)
    time.sleep(1)
    later = clock.since(mark)
    done.set()
    for thread in threads:
        thread.join()
    assert 0.28 <= ran < 0.45, ran  # stat counts in ticks of 10 ms; the sum would be 0.6, the wall clock more
    assert later < 0.45, later
