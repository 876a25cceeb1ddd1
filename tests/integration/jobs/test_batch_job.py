"""Batch jobs through a real TorchServe's bulk lane: same results as in-process, bad rows, Parquet, size guard,
and the deterministic mode's bitwise agreement of stream, bulk and in-process."""

import re

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from models.digits.samples import digit_rows, write_jsonl
from scripts.jobs.batch_job import EXIT_OK, EXIT_ROW_ERRORS, EXIT_STOPPED, main, run_job
from scripts.jobs.outputs import read_results
from scripts.layout import ROOT
from scripts.verify.agreement import Rows, verify_mode
from tests.batch_jobs import digits_job, job_args, on_server, with_bad_lines

ROWS = digit_rows(200)
ARCHIVE = ROOT / "model_store" / "digits.mar"


def server_args(digits_server) -> list[str]:
    return ["--config", str(digits_server.server.config), "--key-file", str(digits_server.endpoints.key_file), "--no-progress"]


def scores(records) -> np.ndarray:
    return np.array([r["prediction"]["scores"] for r in records])


def test_the_bulk_lane_and_the_in_process_runner_agree(digits_server, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    server = run_job(digits_job(source, tmp_path / "server.jsonl", chunk_size=40, concurrency=3, **on_server(digits_server)))
    local = run_job(digits_job(source, tmp_path / "local.jsonl", chunk_size=40, in_process=True, archive=ARCHIVE))
    assert (server.predicted, server.failed, local.predicted, local.failed) == (200, 0, 200, 0)
    # Each of the 5 requests of 40 rows timed from sending to its answer (the bulk bench's p50/p99); none in process.
    assert len(server.request_seconds) == 5 and all(0 < s < 60 for s in server.request_seconds)
    assert local.request_seconds == ()
    from_server, from_local = read_results(tmp_path / "server.jsonl"), read_results(tmp_path / "local.jsonl")
    assert [r["id"] for r in from_server] == [r["id"] for r in from_local] == [f"digit-{n}" for n in range(200)]
    assert [r["prediction"]["label"] for r in from_server] == [r["prediction"]["label"] for r in from_local]
    # Default mode: rows may share a forward pass with other concurrent chunks on the server.
    np.testing.assert_allclose(scores(from_server), scores(from_local), atol=1e-6)
    assert np.mean(scores(from_server).argmax(axis=1) == np.array(ROWS.labels)) >= 0.97


def test_a_bad_row_in_the_middle_is_isolated_by_the_server_path(digits_server, tmp_path, capsys):
    bad = {100: orjson.dumps({"id": "out-of-range", "instance": [99] * 64}), 101: b'{"id": "cut", "instance": [0, 0'}
    source = with_bad_lines(tmp_path / "in.jsonl", ROWS, bad)
    code = main(job_args(source, tmp_path / "out.jsonl", "--chunk-size", "64", *server_args(digits_server)))
    assert code == EXIT_ROW_ERRORS
    results = read_results(tmp_path / "out.jsonl")
    assert [r["id"] for r in results] == [f"digit-{n}" for n in range(200) if n not in (100, 101)]
    errors = [orjson.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert [(e["id"], e["row"], e["error"]["code"]) for e in errors] == [("out-of-range", 101, 400), (102, 102, 400)]
    assert errors[0]["error"]["message"] == "expected 64 values in 0..16, got 99"
    assert errors[1]["error"]["message"].startswith("line 102 is not valid JSON")
    assert "2 rows rejected" in capsys.readouterr().err


def test_parquet_in_parquet_out_through_the_server(digits_server, tmp_path):
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(1000, 1200)), "instance": ROWS.instances}), source)
    code = main(job_args(source, tmp_path / "out.parquet", "--chunk-size", "70", *server_args(digits_server)))
    assert code == EXIT_OK
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("id").to_pylist() == list(range(1000, 1200))
    labels = [p["label"] for p in table.column("prediction").to_pylist()]
    assert np.mean(np.array(labels) == np.array(ROWS.labels)) >= 0.97


def test_parquet_numbers_go_to_the_lane_as_npy_arrays_with_bad_rows_isolated_and_named_as_in_json(digits_server, tmp_path):
    # Numeric Parquet rows are sent as application/x-npy chunks; digits-bulk runs each chunk's micro-batches two at
    # a time (forward_passes). A value out of range in row 101 is named as a JSON body's would be.
    instances = [list(row) for row in ROWS.instances]
    instances[100] = [99] * 64
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"instance": instances}), source)
    served = run_job(digits_job(source, tmp_path / "server.jsonl", chunk_size=150, concurrency=2, **on_server(digits_server)))
    local = run_job(digits_job(source, tmp_path / "local.jsonl", chunk_size=150, in_process=True, archive=ARCHIVE))
    assert (served.predicted, served.failed) == (local.predicted, local.failed) == (199, 1)
    from_server, from_local = read_results(tmp_path / "server.jsonl"), read_results(tmp_path / "local.jsonl")
    assert [r["id"] for r in from_server] == [r["id"] for r in from_local] == [n + 1 for n in range(200) if n != 100]
    np.testing.assert_allclose(scores(from_server), scores(from_local), atol=1e-6)
    [error] = [orjson.loads(line) for line in (tmp_path / "server.errors.jsonl").read_text().splitlines()]
    assert (error["row"], error["error"]["code"], error["error"]["message"]) == (101, 400, "expected 64 values in 0..16, got 99")


def test_a_chunk_over_max_request_size_is_stopped_before_sending_and_resumes_with_the_named_size(digits_server, tmp_path, capsys):
    config = tmp_path / "small.properties"
    text = digits_server.server.config.read_text()
    config.write_text(re.sub(r"(?m)^max_request_size=.*$", "max_request_size=20000", text))
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    args = job_args(source, tmp_path / "out.jsonl", "--config", str(config), "--key-file", str(digits_server.endpoints.key_file))
    args.append("--no-progress")
    assert main(args + ["--chunk-size", "150"]) == EXIT_STOPPED
    message = capsys.readouterr().err
    assert "over the server's max_request_size of 20000 bytes" in message
    fitting = int(re.search(r"use --chunk-size (\d+) or smaller", message).group(1))
    assert main(args + ["--chunk-size", str(fitting), "--resume"]) == EXIT_OK
    assert [r["id"] for r in read_results(tmp_path / "out.jsonl")] == [f"digit-{n}" for n in range(200)]


def test_deterministic_mode_makes_stream_bulk_and_in_process_bitwise_equal(tmp_path):
    """A server of its own: the deterministic copy of the archive, as `make verify` runs it."""
    report = verify_mode("deterministic", ARCHIVE, Rows.of("digits", 120), tmp_path, chunk_size=7)
    assert [path.name for path in report.paths] == ["stream", "bulk", "in-process"]
    assert report.differences() == {("stream", "bulk"): 0.0, ("stream", "in-process"): 0.0, ("bulk", "in-process"): 0.0}
    assert report.failures() == []
    assert "mode: deterministic" in report.text()
