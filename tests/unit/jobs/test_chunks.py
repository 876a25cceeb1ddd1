"""One chunk -> one result per row: retries with backoff, bad-row isolation, and the request-size guard."""

import io

import numpy as np
import orjson
import pytest

from scripts.jobs.chunks import RetryPolicy, run_chunk
from scripts.jobs.inputs import Row
from scripts.jobs.runners import JobError, Reply, RowTooLarge, TransientError, encode_chunk, narrowest

NO_WAIT = RetryPolicy(attempts=3, first_delay=0.0)


class FakeLane:
    """Answers like the handler: the first instance that is not an int is named in a 400; else doubles.

    `failures` are thrown or answered first (a TransientError, or a status code), one per call.
    """

    def __init__(self, failures=()):
        self.failures = list(failures)
        self.calls: list[list] = []

    def send(self, instances):
        self.calls.append(list(instances))
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            return Reply(failure, {"code": failure, "type": "ServiceUnavailable", "message": "busy"})
        for position, item in enumerate(instances):
            if not isinstance(item, int):
                return Reply(
                    400,
                    {"code": 400, "type": "InvalidInput", "message": f"instances[{position}]: expected a number, got {item!r}"},
                )
        return Reply(200, {"predictions": [2 * item for item in instances]})


def rows(*instances) -> list[Row]:
    return [Row(index, f"id{index}", item) for index, item in enumerate(instances)]


def test_bad_rows_are_isolated_and_the_rest_is_predicted_in_order():
    lane = FakeLane()
    results = run_chunk(lane.send, rows(1, "x", 3, "y", 5), NO_WAIT)
    assert [r.prediction for r in results] == [2, None, 6, None, 10]
    assert [r.error["message"] if r.error else None for r in results] == [
        None,
        "expected a number, got 'x'",
        None,
        "expected a number, got 'y'",
        None,
    ]
    assert lane.calls == [[1, "x", 3, "y", 5], [1, 3, "y", 5], [1, 3, 5]]


def test_rows_that_could_not_be_read_are_not_sent():
    lane = FakeLane()
    chunk = [Row(0, "a", 1), Row(1, "b", None, problem="line 2 is not valid JSON"), Row(2, "c", 3)]
    results = run_chunk(lane.send, chunk, NO_WAIT)
    assert lane.calls == [[1, 3]]
    assert [r.prediction for r in results] == [2, None, 6]
    assert results[1].error == {"code": 400, "type": "UnreadableRow", "message": "line 2 is not valid JSON"}


def test_an_error_that_names_no_row_halves_the_chunk_until_the_row_is_found():
    class PickyLane(FakeLane):
        def send(self, instances):
            self.calls.append(list(instances))
            if 13 in instances:
                return Reply(507, {"code": 507, "type": "OutOfResources", "message": "out of device memory for a single row"})
            return Reply(200, {"predictions": [2 * item for item in instances]})

    lane = PickyLane()
    results = run_chunk(lane.send, rows(1, 2, 13, 4), NO_WAIT)
    assert [r.prediction for r in results] == [2, 4, None, 8]
    assert results[2].error["code"] == 507 and "single row" in results[2].error["message"]


def test_a_507_that_names_its_row_fails_that_row_and_resends_the_rest_once():
    class MemoryLane(FakeLane):
        def send(self, instances):
            self.calls.append(list(instances))
            if 13 in instances:
                position = instances.index(13)
                message = f"instances[{position}]: out of device memory for this row even alone; send it smaller"
                return Reply(507, {"code": 507, "type": "OutOfResources", "message": message})
            return Reply(200, {"predictions": [2 * item for item in instances]})

    lane = MemoryLane()
    results = run_chunk(lane.send, rows(1, 2, 13, 4), NO_WAIT)
    assert lane.calls == [[1, 2, 13, 4], [1, 2, 4]]
    assert [r.prediction for r in results] == [2, 4, None, 8]
    assert results[2].error == {
        "code": 507,
        "type": "OutOfResources",
        "message": "out of device memory for this row even alone; send it smaller",
    }


def test_failures_of_the_server_are_retried_then_succeed():
    lane = FakeLane(failures=[TransientError("connection refused"), 503])
    results = run_chunk(lane.send, rows(1, 2), NO_WAIT)
    assert [r.prediction for r in results] == [2, 4]
    assert len(lane.calls) == 3


def test_a_chunk_that_keeps_failing_stops_the_job_with_a_resume_hint():
    lane = FakeLane(failures=[503, 500, TransientError("reset")])
    with pytest.raises(JobError, match=r"rows 1..2 failed 3 times in 0s \(retried for up to 300s\), last with reset") as error:
        run_chunk(lane.send, rows(1, 2), NO_WAIT)
    assert "--resume" in str(error.value)


def test_a_worker_that_died_is_retried_but_the_handlers_out_of_memory_halves_the_chunk():
    died = Reply(507, {"code": 507, "type": "InternalServerException", "message": "Worker died."})
    answers = [died, died]

    def send(instances):
        return answers.pop(0) if answers else Reply(200, {"predictions": [2 * item for item in instances]})

    results = run_chunk(send, rows(1, 2, 3), NO_WAIT)
    assert [r.prediction for r in results] == [2, 4, 6] and answers == []


def test_retries_go_on_for_the_stated_patience_then_stop_the_job_naming_the_last_failure():
    told: list[str] = []
    calls = []

    def send(instances):
        calls.append(instances)
        return Reply(503, {"code": 503, "type": "ServiceUnavailable", "message": "queue full (job_queue_size=6)"})

    policy = RetryPolicy(patience=0.2, first_delay=0.01, max_delay=0.02, notify=told.append)
    stated = r"rows 1..2 failed \d+ times in 0s \(retried for up to 0s\), last with HTTP 503: queue full"
    with pytest.raises(JobError, match=stated):
        run_chunk(send, rows(1, 2), policy)
    assert len(calls) >= 5 and len(told) == len(calls) - 1
    assert told[0].startswith("rows 1..2: HTTP 503: queue full (job_queue_size=6); try 2 in ")


def test_a_bad_token_stops_the_job_instead_of_failing_every_row():
    lane = FakeLane(failures=[401])
    with pytest.raises(JobError, match="HTTP 401.*token"):
        run_chunk(lane.send, rows(1, 2), NO_WAIT)


def test_backoff_grows_and_is_capped():
    policy = RetryPolicy(first_delay=1.0, max_delay=5.0)
    assert 0.5 <= policy.delay(0) <= 1.0
    assert 2.0 <= policy.delay(2) <= 4.0
    assert 2.5 <= policy.delay(10) <= 5.0


def test_a_chunk_over_the_request_size_is_refused_with_a_chunk_size_that_fits():
    instances = [[16] * 64 for _ in range(100)]
    limit = len(encode_chunk(instances, 10**9)[0]) // 3
    with pytest.raises(JobError, match=r"a chunk of 100 rows encodes to \d+ bytes, over the server's max_request_size") as error:
        encode_chunk(instances, limit)
    suggested = int(str(error.value).split("--chunk-size ")[1].split()[0])
    assert 1 <= suggested < 34
    assert len(encode_chunk(instances[:suggested], limit)[0]) <= limit


def test_numeric_numpy_rows_go_as_one_npy_array_and_anything_else_as_json():
    rows = np.arange(3 * 64, dtype=np.int64).reshape(3, 64) % 17
    body, media = encode_chunk(list(rows), 10**9)
    assert media == "application/x-npy"
    sent = np.load(io.BytesIO(body), allow_pickle=False)
    assert np.array_equal(sent, rows) and sent.dtype == np.uint8  # 0..16: the narrowest type that holds them
    # Lists, mixed shapes or dtypes, text: JSON, as before.
    for instances in ([[1] * 64], [rows[0], rows[1][:8]], [rows[0], rows[1].astype(np.float32)]):
        body, media = encode_chunk(instances, 10**9)
        assert media == "application/vnd.instances+json"
        assert len(orjson.loads(body)["instances"]) == len(instances)
    # The size limit holds for the array too, and names a chunk size that fits.
    limit = len(encode_chunk(list(rows), 10**9)[0]) - 1
    with pytest.raises(JobError, match=r"a chunk of 3 rows encodes to \d+ bytes"):
        encode_chunk(list(rows), limit)
    with pytest.raises(RowTooLarge):
        encode_chunk([rows[0]], 100)


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        ([[0, 16], [3, 255]], np.uint8),
        ([[-1, 16]], np.int8),
        ([[0, 300]], np.uint16),
        ([[-40000, 1]], np.int32),
        ([[0, 2**40]], np.int64),
        ([[0.5, 16.0]], np.float32),
        ([[0.1, 16.0]], np.float64),  # 0.1 is not a float32: kept
        ([[np.nan, 1.0]], np.float64),
    ],
)
def test_numbers_are_sent_in_the_narrowest_type_that_holds_them_exactly(values, dtype):
    array = np.array(values, dtype=np.float64 if isinstance(values[0][0], float) else np.int64)
    narrow = narrowest(array)
    assert narrow.dtype == dtype
    np.testing.assert_array_equal(narrow.astype(array.dtype), array)


def test_a_job_whose_output_is_its_input_is_refused_before_it_truncates_the_rows(tmp_path):
    from scripts.jobs.batch_job import JobConfig

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"instance": [1]}\n')
    same = JobConfig(model="digits", input=rows, output=tmp_path / "." / "rows.jsonl", overwrite=True)
    with pytest.raises(JobError, match="is the input itself"):
        same.check()
    assert rows.read_text() == '{"instance": [1]}\n'
    JobConfig(model="digits", input=rows, output=tmp_path / "out.jsonl").check()  # another file is fine
