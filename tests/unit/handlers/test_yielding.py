"""The cooperative yield: a background lane's passes shrink and it yields while a stream lane's signal is raised,
and run at full size when it is not; the signal's slots are per process and freed when one ends."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from handlers.lane_signal import SLOTS, LaneSignal
from handlers.yielding import YieldingPasses
from tests.unit.handlers.cpu_work import run_for


@pytest.fixture(autouse=True)
def each_yield_point_finds_the_thread_has_run(monkeypatch):
    """Each read of the thread's CPU clock finds it a second on, so the spacing of yields by the thread's run
    (test_op_yield.py gives that test a clock of its own) never holds one back here, however little CPU a pass takes."""
    ticks = itertools.count()
    monkeypatch.setattr("handlers.yielding.thread_cpu_s", lambda: float(next(ticks)))


FULL = 64


def passes_of(yielding: YieldingPasses, rows: list[int], on_each=None) -> tuple[list[int], list[int]]:
    """Run `rows` (each row's cost is 1) through `yielding`; returns the rows of each pass and the results."""
    sizes = []

    def run(part):
        sizes.append(len(part))
        run_for(0.0002 * len(part))  # a pass's time grows with its rows, as a forward pass's does
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


def test_the_passes_stay_bounded_for_the_linger_after_a_stream_batch_ends_then_full(tmp_path):
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), FULL, on_cpu=True, pass_s=0.001, linger_s=0.05)
    with stream.raised():
        pass  # a stream batch that ended just now
    ended = time.monotonic()
    sizes = []

    def run(part):
        sizes.append((time.monotonic() - ended, len(part)))
        run_for(0.0002 * len(part))
        return part

    yielding.run(list(range(3000)), lambda row: 1, run)
    within = [size for at, size in sizes if at < 0.045]
    after = [size for at, size in sizes if at > 0.055]
    assert within and max(within) <= 6  # 0.2 ms a row: about 5 fit 1 ms
    assert after and set(after[:-1]) == {FULL}  # the last holds what was left
    assert yielding.stats.holds_s == [] and yielding.stats.holds_after_full_s == []  # no batch ran meanwhile


def test_a_dropped_slot_keeps_when_it_dropped_and_reads_as_not_raised(tmp_path):
    stream, reader = LaneSignal("cpu", tmp_path), LaneSignal("cpu", tmp_path)
    stream.claim()
    with stream.raised():
        assert reader.raised_since() > 0 and not reader.dropped_within(10**9)
    dropped = -stream._slots[0]
    assert dropped > 0 and reader.raised_since() == 0 and reader.rises() == []
    assert reader.dropped_within(10**9) and not reader.dropped_within(1, now_ns=dropped + 2)


def test_bounded_passes_grow_to_the_bound_despite_a_fixed_cost_a_pass(tmp_path):
    """A pass costs 0.6 ms plus 0.05 ms a row: a cost per row learned from one-row passes would keep them at one row;
    the learned size grows to 7 rows, a 0.95 ms pass, within the 1 ms bound (the times given, not measured)."""
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), FULL, on_cpu=True, pass_s=0.001)
    rows, sizes = list(range(FULL)), []
    for _ in range(40):
        count = yielding.bounded_rows(rows, rows, lambda row: 1)
        sizes.append(count)
        yielding._learn(0.0006 + 0.00005 * count, count)
    assert sizes[0] == 1 and sizes[1] == 2  # 1 row: 0.65 ms, 1.54 rows fit, rounded to 2
    assert set(sizes[-10:]) == {7}  # 7.4 rows fit a 0.95 ms pass of 7: it stays there


def test_a_bounded_pass_is_timed_in_what_its_thread_ran_not_in_its_waits(tmp_path):
    """A pass thread that waits (for the GIL, which a worker's two pass threads take turns at, or for a core a stream
    thread took) holds no core. Each pass here runs 0.02 ms a row and then waits 2 ms: on the wall clock every pass
    would be over the 1 ms bound and stay at one row (digits' bulk core fell so to 1,600-2,000 rows/s in process, its
    full passes 21,700-23,700); in the thread's run time they grow to the bound."""
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), FULL, on_cpu=True, pass_s=0.001)
    sizes, walls = [], []

    def run(part):
        started = time.perf_counter()
        sizes.append(len(part))
        run_for(0.00002 * len(part))
        time.sleep(0.002)
        walls.append(time.perf_counter() - started)
        return part

    with stream.raised():
        results = yielding.run(list(range(300)), lambda row: 1, run)
    assert results == list(range(300))
    assert min(walls) > 0.002  # every pass took longer than the bound on the wall clock
    assert sizes[0] == 1 and max(sizes) >= 16, sizes  # about 50 rows' run fit the bound
    assert yielding.stats.cut_passes > 0  # still cut: bounded, not full size


def test_pulled_passes_each_thread_takes_its_own_slices_every_row_once_in_order(tmp_path):
    stream = LaneSignal("cpu", tmp_path)
    stream.claim()
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), FULL, on_cpu=True, pass_s=0.001)
    threads: dict[str, list[int]] = {}

    def run(part):
        import threading

        threads.setdefault(threading.current_thread().name, []).append(len(part))
        run_for(0.0002 * len(part))
        return [row * 10 for row in part]

    rows = list(range(1000))
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="pass") as pool:
        assert yielding.run_pulled(rows, lambda row: 1, run, pool, 2, slice_rows=100) == [r * 10 for r in rows]
        assert len(threads) == 2 and sorted(threads) == ["pass_0", "pass_1"]  # both took slices
        assert all(size == 100 for sizes in threads.values() for size in sizes)  # full slices: nothing raised
        threads.clear()
        with stream.raised():
            assert yielding.run_pulled(rows[:200], lambda row: 1, run, pool, 2, slice_rows=100) == [r * 10 for r in rows[:200]]
        bounded = [size for sizes in threads.values() for size in sizes]
        assert sum(bounded) == 200 and max(bounded) <= 6 and yielding.stats.cut_passes >= len(bounded) - 2


def test_a_pulled_pass_that_fails_stops_the_other_threads_and_raises(tmp_path):
    yielding = YieldingPasses(LaneSignal("cpu", tmp_path), FULL, on_cpu=True, pass_s=0.001)
    ran = []

    def run(part):
        ran.append(part[0])
        if part[0] == 200:
            raise RuntimeError("pass failed")
        time.sleep(0.002)
        return part

    with ThreadPoolExecutor(max_workers=2) as pool, pytest.raises(RuntimeError, match="pass failed"):
        yielding.run_pulled(list(range(2000)), lambda row: 1, run, pool, 2, slice_rows=100)
    assert len(ran) <= 5  # slices 0, 100, 200 and at most what was in flight: not the other 17
