"""Batch jobs in-process (no server): bad rows, CSV/Parquet inputs, Parquet output, resume after SIGKILL."""

import os
import signal
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from handlers.core import InferenceCore
from models.digits.samples import digit_rows, write_jsonl
from scripts.archive.reader import MarFile
from scripts.jobs.batch_job import EXIT_ROW_ERRORS, JobConfig, forward_workers, main, run_job
from scripts.jobs.outputs import read_results
from scripts.jobs.runners import JobError
from scripts.layout import ROOT
from tests.batch_jobs import assert_same, job_args, with_bad_lines

ROWS = digit_rows(120)


@pytest.fixture(scope="module")
def digits_archive(tmp_path_factory, digits_model_dir):
    """A .mar as `make archive` lays it out (model-config.yaml + digits.pt2), without needing the archiver."""
    archive = tmp_path_factory.mktemp("store") / "digits.mar"
    with zipfile.ZipFile(archive, "w") as mar:
        mar.write(ROOT / "models" / "digits" / "model-config.yaml", "model-config.yaml")
        mar.write(digits_model_dir / "digits.pt2", "digits.pt2")
    MarFile(archive).record_digest()  # as `make archive` does: in-process jobs load only recorded archives
    return archive


@pytest.fixture(scope="module")
def reference(tmp_path_factory, digits_archive):
    """The 120 rows in one uninterrupted JSONL job: what every other way of running them must give."""
    folder = tmp_path_factory.mktemp("reference")
    output = folder / "out.jsonl"
    run_job(
        JobConfig(
            model="digits",
            input=write_jsonl(folder / "in.jsonl", ROWS),
            output=output,
            in_process=True,
            archive=digits_archive,
            chunk_size=50,
            progress_bar=False,
        )
    )
    return read_results(output)


def job(tmp_path, archive, input, output="out.jsonl", **options):
    return JobConfig(
        model="digits", input=input, output=tmp_path / output, in_process=True, archive=archive, progress_bar=False, **options
    )


def test_every_row_once_in_order_with_the_held_out_labels(reference):
    assert [r["id"] for r in reference] == [f"digit-{n}" for n in range(120)]
    labels = [r["prediction"]["label"] for r in reference]
    assert np.mean(np.array(labels) == np.array(ROWS.labels)) >= 0.97


def test_a_bad_row_in_the_middle_goes_to_the_errors_file_and_the_job_exits_1(tmp_path, digits_archive, reference, capsys):
    source = with_bad_lines(tmp_path / "in.jsonl", ROWS, {60: orjson.dumps({"id": "short", "instance": [1, 2, 3]})})
    options = ["--in-process", "--archive", str(digits_archive), "--chunk-size", "25", "--no-progress"]
    code = main(job_args(source, tmp_path / "out.jsonl", *options))
    assert code == EXIT_ROW_ERRORS
    assert_same(read_results(tmp_path / "out.jsonl"), reference[:60] + reference[61:])
    errors = [orjson.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert errors == [
        {
            "id": "short",
            "row": 61,
            "error": {"code": 400, "type": "InvalidInput", "message": "expected 64 values in 0..16 (or an 8x8 list), got 3"},
        }
    ]
    summary = capsys.readouterr().err
    assert "119 predicted" in summary and "1 rows rejected" in summary


def test_csv_and_parquet_inputs_give_the_same_results_as_jsonl(tmp_path, digits_archive, reference):
    ids = [f"digit-{n}" for n in range(120)]
    csv_path = tmp_path / "in.csv"
    csv_path.write_text(
        "\n".join(
            ["id," + ",".join(f"p{i}" for i in range(64))]
            + [f"{i}," + ",".join(map(str, row)) for i, row in zip(ids, ROWS.instances, strict=True)]
        )
        + "\n"
    )
    parquet_path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ids, "instance": ROWS.instances}), parquet_path)
    run_job(job(tmp_path, digits_archive, csv_path, "from-csv.jsonl", chunk_size=33))
    run_job(job(tmp_path, digits_archive, parquet_path, "from-parquet.parquet", chunk_size=64))
    assert_same(read_results(tmp_path / "from-csv.jsonl"), reference)
    assert_same(read_results(tmp_path / "from-parquet.parquet"), reference)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_bad_value_in_a_parquet_row_fails_that_row_alone_named_as_in_jsonl(tmp_path, digits_archive, reference, prefetch):
    """Parquet rows come as numpy rows (no Python number per pixel); a value out of range sends the chunk down the
    item-by-item path, which names it as it would in a JSON list."""
    instances = [list(row) for row in ROWS.instances]
    instances[70][5] = 17
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"digit-{n}" for n in range(120)], "instance": instances}), source)
    summary = run_job(job(tmp_path, digits_archive, source, chunk_size=50, prefetch=prefetch))
    assert (summary.predicted, summary.failed) == (119, 1)
    assert_same(read_results(tmp_path / "out.jsonl"), reference[:70] + reference[71:])
    errors = [orjson.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert errors == [
        {
            "id": "digit-70",
            "row": 71,
            "error": {"code": 400, "type": "InvalidInput", "message": "expected 64 values in 0..16, got 17"},
        }
    ]


def test_resume_after_the_job_is_killed_mid_run(tmp_path, digits_archive, reference):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    output = tmp_path / "out.jsonl"
    progress = tmp_path / "out.jsonl.progress.json"
    command = [sys.executable, "-m", "scripts.jobs.batch_job"]
    command += job_args(source, output, "--in-process", "--archive", str(digits_archive), "--no-progress")
    # One row per chunk keeps the first run slow enough to be caught in the middle.
    process = subprocess.Popen(command + ["--chunk-size", "1"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        killed_at = wait_for_rows(progress, process, at_least=10)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    rows_done = orjson.loads(progress.read_bytes())["rows_done"]
    assert killed_at <= rows_done < 120
    with output.open("ab") as out:  # what a kill in the middle of a write leaves behind
        out.write(b'{"id":"digit-99","predic')
    resumed = subprocess.run(command + ["--chunk-size", "50", "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed after row {rows_done}" in resumed.stderr
    assert_same(read_results(output), reference)
    assert not progress.exists()


def wait_for_rows(progress, process, at_least: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the job ended before it could be killed"
        if progress.exists():
            try:
                done = orjson.loads(progress.read_bytes())["rows_done"]
            except (orjson.JSONDecodeError, FileNotFoundError):
                done = 0
            if done >= at_least:
                return done
        time.sleep(0.01)
    raise AssertionError(f"the job did not get to {at_least} rows in {timeout}s")


def test_prefetch_writes_the_same_results_as_one_thread(tmp_path, digits_archive):
    """The same rows, ids, labels and errors; scores within float rounding, since the passes run on one torch thread
    each where one thread doing everything runs them on all (MKL's sgemm rounds by thread count on some CPUs:
    deterministic mode pins a pass's threads, tests/unit/handlers/test_deterministic_mode.py)."""
    bad = {30: orjson.dumps({"id": "short", "instance": [1, 2, 3]}), 90: b"{broken"}
    source = with_bad_lines(tmp_path / "in.jsonl", ROWS, bad)
    outputs = {}
    for prefetch in (0, 3):
        output = tmp_path / f"out-{prefetch}.jsonl"
        summary = run_job(job(tmp_path, digits_archive, source, output.name, chunk_size=25, prefetch=prefetch))
        assert (summary.predicted, summary.failed) == (118, 2)  # two of the 120 lines replaced
        outputs[prefetch] = (read_results(output), (tmp_path / f"out-{prefetch}.errors.jsonl").read_bytes())
    assert_same(outputs[3][0], outputs[0][0])
    assert len(outputs[0][0]) == 118
    assert outputs[3][1] == outputs[0][1]
    assert outputs[0][1].count(b"\n") == 2


def test_on_the_cpu_a_prefetching_job_runs_a_pass_per_torch_thread_each_on_one(tmp_path, digits_archive, monkeypatch):
    """forward_workers: with prefetch, one forward pass per torch thread at once, each on one thread; torch's count
    is back afterwards; the results are those of one thread doing everything."""
    seen: list[tuple[int, int]] = []
    predict = InferenceCore.predict

    def watched(self, rows, stages=None):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        time.sleep(0.02)  # long enough for the other worker to take the next chunk
        return predict(self, rows, stages)

    monkeypatch.setattr(InferenceCore, "predict", watched)
    torch.set_num_threads(2)  # tests/conftest.py sets it back after the test
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    assert forward_workers(job(tmp_path, digits_archive, source, prefetch=2)) == 2
    assert forward_workers(job(tmp_path, digits_archive, source, prefetch=0)) == 1
    summary = run_job(job(tmp_path, digits_archive, source, chunk_size=20, prefetch=2))
    assert torch.get_num_threads() == 2
    assert summary.predicted == 120
    assert {threads for _, threads in seen} == {1}
    assert len({thread for thread, _ in seen}) == 2
    results = read_results(tmp_path / "out.jsonl")
    assert [r["id"] for r in results] == [f"digit-{n}" for n in range(120)]


def test_a_negative_prefetch_is_refused(tmp_path, digits_archive):
    with pytest.raises(JobError, match="--prefetch must be at least 0, got -1"):
        run_job(job(tmp_path, digits_archive, tmp_path / "in.jsonl", prefetch=-1))


def test_malloc_as_lane_sets_this_process_as_a_worker_of_that_lane_sets_its_own(digits_archive):
    """digits-bulk's workers keep a pass's blocks in the heap (handler.mmap_threshold_mib: 32), the stream lane's
    map them (4); the batch bench runs its ceiling under digits-bulk's. Each in a fresh interpreter: malloc's
    settings are per process."""
    code = (
        "import sys, pathlib; from scripts.archive.core import malloc_as_lane; "
        "print(malloc_as_lane(pathlib.Path(sys.argv[1]), sys.argv[2]).threshold)"
    )

    def slack(lane: str) -> int:
        done = subprocess.run([sys.executable, "-c", code, str(digits_archive), lane], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    assert slack("digits-bulk") == 32 * 2**20
    assert slack("digits") == 4 * 2**20


PRIORITY_CHILD = """
import json, sys
from handlers.priority import thread_policies
from scripts.jobs.batch_job import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "policies": thread_policies()}))
"""


@pytest.mark.parametrize(("options", "policy"), [((), os.SCHED_IDLE), (("--normal-priority",), os.SCHED_OTHER)])
def test_the_batch_job_command_runs_at_idle_priority_unless_told_otherwise(tmp_path, digits_archive, options, policy):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    archive = ("--in-process", "--archive", str(digits_archive), "--no-progress")
    args = job_args(source, tmp_path / "out.jsonl", *archive, *options, keep_priority=False)
    done = subprocess.run([sys.executable, "-c", PRIORITY_CHILD, *args], capture_output=True, text=True, cwd=ROOT, check=True)
    report = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == 0
    assert len(read_results(tmp_path / "out.jsonl")) == len(ROWS.labels)
    assert set(report["policies"].values()) == {policy}
