"""The in-process pipeline: chunks decoded ahead in order, at most `depth` ahead, errors where they belong, and the
same outcome per row as the chunk sent through the core in one piece (the path the server takes)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from models.digits.samples import digit_rows
from scripts.jobs.chunks import RetryPolicy, run_chunk
from scripts.jobs.inputs import Chunk, Row
from scripts.jobs.prefetch import decode_chunk, predict_chunk, prefetched
from scripts.jobs.runners import InProcessRunner


def test_prefetched_keeps_order_and_stays_within_depth():
    pulled = []
    lock = threading.Lock()

    def items():
        for number in range(50):
            with lock:
                pulled.append(number)
            yield number

    seen, ahead = [], []
    for value in prefetched(items(), lambda n: n * 10, depth=3):
        time.sleep(0.005)  # a slow consumer: the thread must wait for room, not run away
        with lock:
            ahead.append(len(pulled) - len(seen))
        seen.append(value)
    assert seen == [n * 10 for n in range(50)]
    # Ready in the queue (depth) + the one being put + the one being prepared, past the one handed out.
    assert max(ahead) <= 3 + 2


def test_prefetched_raises_the_threads_error_in_its_place():
    def items():
        yield 1
        yield 2
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for value in prefetched(items(), lambda n: n, depth=2):
            got.append(value)
    assert got == [1, 2]


def test_prefetched_stops_its_thread_when_closed_early():
    def items():
        yield from range(1000)

    stream = prefetched(items(), lambda n: n, depth=2)
    assert next(stream) == 0
    stream.close()
    assert not any(thread.name == "prefetch" for thread in threading.enumerate())


def test_prefetched_refuses_depth_zero():
    with pytest.raises(ValueError, match="at least 1"):
        next(prefetched(iter([1]), lambda n: n, depth=0))


def test_decoded_chunk_gives_what_the_whole_chunk_through_the_core_gives(digits_core, tmp_path):
    good = digit_rows(40).instances
    instances = good[:10] + [[1, 2, 3]] + good[10:25] + [[17] * 64, None] + good[25:]
    rows = [Row(index, f"r{index}", instance) for index, instance in enumerate(instances)]
    rows.append(Row(len(rows), "broken", None, problem="line 44: not JSON"))
    piped = predict_chunk(digits_core, decode_chunk(digits_core, Chunk(rows)))
    sent = run_chunk(InProcessRunner(digits_core, tmp_path / "digits.mar").send, rows, RetryPolicy(attempts=1))
    assert [(r.row.id, r.prediction, r.error) for r in piped] == [(r.row.id, r.prediction, r.error) for r in sent]
    failed = {r.row.id: r.error for r in piped if r.error is not None}
    assert sorted(failed) == ["broken", "r10", "r26", "r27"]
    message = "expected 64 values in 0..16 (or an 8x8 list), got 3"
    assert failed["r10"] == {"code": 400, "type": "InvalidInput", "message": message}
    assert failed["broken"]["type"] == "UnreadableRow"
    assert sum(r.prediction is not None for r in piped) == 40


def test_a_numeric_chunk_decodes_in_one_pass_and_a_bad_value_fails_its_row_alone(digits_core, tmp_path):
    """A chunk whose instances came as one array (numeric Parquet) gives what its rows give one by one; with a value
    out of range, that row fails with the message JSON would give and the others are predicted."""
    grids = np.array(digit_rows(30).instances, dtype=np.int64)
    rows = [Row(index, f"r{index}", None) for index in range(len(grids))]  # as the Parquet reader leaves them
    as_array = predict_chunk(digits_core, decode_chunk(digits_core, Chunk(rows, grids)))
    assert all(row.instance is None for row in rows)  # decoded from the array, no numpy row made per row
    one_by_one = predict_chunk(
        digits_core, decode_chunk(digits_core, Chunk([Row(r.index, r.id, g) for r, g in zip(rows, grids, strict=True)]))
    )
    assert [(r.row.id, r.prediction, r.error) for r in as_array] == [(r.row.id, r.prediction, r.error) for r in one_by_one]
    assert all(r.error is None for r in as_array)
    grids[12, 5] = 17
    rows = [Row(index, f"r{index}", None) for index in range(len(grids))]
    results = predict_chunk(digits_core, decode_chunk(digits_core, Chunk(rows, grids)))
    assert all(isinstance(row.instance, np.ndarray) for row in rows)  # the row-by-row path filled them in
    failed = {r.row.id: r.error for r in results if r.error is not None}
    assert failed == {"r12": {"code": 400, "type": "InvalidInput", "message": "expected 64 values in 0..16, got 17"}}
    assert [r.prediction for r in results if r.row.id != "r12"] == [r.prediction for r in one_by_one if r.row.id != "r12"]
