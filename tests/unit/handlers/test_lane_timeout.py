"""handlers/torchserve/lane_timeout.py in a real process: a batch past the lane's limit ends the worker with a log line
saying why; a batch that ends in time does not."""

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
timeout = LaneTimeout("digits", {timeout}, poll_s=0.05)
timeout.running(3)
time.sleep({batch})
timeout.done()
time.sleep(0.5)
print("answered")
"""


def run(timeout: float, batch: float) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    code = PROGRAM.format(timeout=timeout, batch=batch)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


def test_a_batch_past_the_lanes_timeout_ends_the_worker_within_the_timeout_and_a_poll():
    done, seconds = run(timeout=0.5, batch=30)
    assert done.returncode == EXIT_STATUS
    assert "answered" not in done.stdout
    assert "lane digits: a batch of 3 request(s) ran past handler.response_timeout_s=0.5 s" in done.stderr
    assert seconds < 10  # the batch would have taken 30 s


def test_a_batch_within_the_timeout_is_left_alone():
    done, _ = run(timeout=2, batch=0.1)
    assert (done.returncode, done.stdout.strip()) == (0, "answered")
