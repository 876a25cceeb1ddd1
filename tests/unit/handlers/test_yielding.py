"""The cooperative yield: a background lane's passes shrink and it yields while a stream lane's signal is raised,
and run at full size when it is not; the signal's slots are per process and freed when one ends."""

from __future__ import annotations

import subprocess
import sys
import time

from handlers.lane_signal import SLOTS, LaneSignal
from handlers.yielding import YieldingPasses

FULL = 64


def passes_of(yielding: YieldingPasses, rows: list[int], on_each=None) -> tuple[list[int], list[int]]:
    """Run `rows` (each row's cost is 1) through `yielding`; returns the rows of each pass and the results."""
    sizes = []

    def run(part):
        sizes.append(len(part))
        time.sleep(0.0002 * len(part))  # a pass's time grows with its rows, as a forward pass's does
        if on_each is not None:
            on_each(len(sizes))
        return [row * 10 for row in part]

    results = yielding.run(rows, lambda row: 1, run)
    return sizes, results


def test_passes_are_full_size_while_no_stream_lane_is_busy(tmp_path):
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), FULL, on_cpu=True, pass_s=0.001)
    sizes, results = passes_of(yielding, list(range(300)))
    assert sizes == [64, 64, 64, 64, 44]
    assert results == [row * 10 for row in range(300)]
    assert yielding.stats.cut_passes == 0 and yielding.stats.yielded_s == 0
    assert yielding.stats.holds_s == [] and yielding.stats.holds_after_full_s == []


def test_passes_shrink_to_the_time_bound_and_the_lane_yields_while_a_stream_lane_is_busy(tmp_path):
    stream = LaneSignal("cpu", tmp_path)
    assert stream.claim() == 0
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), FULL, on_cpu=True, pass_s=0.001)
    with stream.raised():
        sizes, results = passes_of(yielding, list(range(200)))
    assert results == [row * 10 for row in range(200)]
    assert sizes[0] == 1  # nothing timed yet: one row
    # 0.2 ms a row (and the clock's overhead): at most 5 rows fit 1 ms, never a full pass.
    assert max(sizes) <= 5 and sum(sizes) == 200
    assert yielding.stats.cut_passes >= len(sizes) - 1  # the last may hold all that was left
    # One rise, seen at the first yield point, before any pass: not after a bounded pass.
    assert yielding.stats.holds_after_full_s != [] and yielding.stats.holds_s == []
    assert yielding.stats.yielded_s > 0


def test_full_size_again_once_the_signal_drops(tmp_path):
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), FULL, on_cpu=True, pass_s=0.001)
    raised = stream.raised()
    raised.__enter__()

    def drop_after_ten(passes: int) -> None:
        if passes == 10:
            raised.__exit__(None, None, None)

    sizes, _ = passes_of(yielding, list(range(400)), drop_after_ten)
    assert max(sizes[:10]) <= 5
    assert sizes[10:12] == [64, 64]


def test_on_a_device_the_lane_waits_while_raised_but_at_most_max_wait_so_it_is_never_starved(tmp_path):
    stream = LaneSignal("cuda0", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cuda0", tmp_path), FULL, on_cpu=False, pass_s=0.002, max_wait_s=0.01)
    with stream.raised():
        sizes, results = passes_of(yielding, list(range(20)))
    assert results == [row * 10 for row in range(20)]  # every row ran although the signal never dropped
    assert yielding.stats.yielded_s >= 0.01 * len(sizes) * 0.9


def test_each_process_claims_its_own_slot_and_a_dead_ones_slot_is_free_again(tmp_path):
    mine = LaneSignal("cpu", tmp_path)
    assert mine.claim() == 0
    child = (
        "from pathlib import Path; from handlers.lane_signal import LaneSignal; "
        f"print(LaneSignal('cpu', Path('{tmp_path}')).claim())"
    )
    first = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    assert first.stdout.strip() == "1"  # slot 0 is held by this process
    again = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    assert again.stdout.strip() == "1"  # the first child ended: its lock, hence its slot, went with it
    assert SLOTS == 64


def test_a_slot_left_raised_by_a_worker_that_died_mid_batch_is_stale_after_the_limit(tmp_path):
    from handlers.lane_signal import STALE_S

    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    reader = LaneSignal("cpu", tmp_path)
    with stream.raised():
        rose = reader.raised_since()
        assert rose > 0
        assert reader.raised_since(now_ns=rose + int((STALE_S + 1) * 1e9)) == 0
    assert reader.raised_since() == 0


def test_a_rise_during_a_bounded_pass_is_held_apart_from_one_during_a_full_pass(tmp_path):
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), FULL, on_cpu=True, pass_s=0.001)
    first, second = stream.raised(), stream.raised()
    first.__enter__()

    def rise_again(passes: int) -> None:
        if passes == 5:  # a new rise while the passes are bounded
            first.__exit__(None, None, None)
            second.__enter__()

    passes_of(yielding, list(range(50)), rise_again)
    second.__exit__(None, None, None)
    assert len(yielding.stats.holds_after_full_s) == 1 and len(yielding.stats.holds_s) == 1
    taken = yielding.stats.take()
    assert len(taken.holds_s) == 1 and yielding.stats.holds_s == [] and yielding.stats.cut_passes == 0
