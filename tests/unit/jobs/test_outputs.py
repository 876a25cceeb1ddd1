"""The resumable result sink: commits in order, cuts an uncommitted tail on resume, refuses foreign outputs."""

import orjson
import pytest

from scripts.jobs.inputs import Row
from scripts.jobs.outputs import OutputError, OutputPaths, Progress, ResultSink, RowResult, default_errors_path, read_results


def results(first: int, count: int, bad: set[int] = frozenset()) -> list[RowResult]:
    out = []
    for index in range(first, first + count):
        row = Row(index, f"r{index}", None)
        if index in bad:
            out.append(RowResult(row, error={"code": 400, "type": "InvalidInput", "message": f"bad {index}"}))
        else:
            out.append(RowResult(row, prediction={"label": index % 10}))
    return out


def paths_for(tmp_path, name="out.jsonl") -> OutputPaths:
    output = tmp_path / name
    return OutputPaths(output, default_errors_path(output))


def test_commits_write_results_and_errors_in_input_order(tmp_path):
    paths = paths_for(tmp_path)
    sink = ResultSink.start(paths, Progress("in", "digits", 6), overwrite=False)
    sink.commit(results(0, 3, bad={1}))
    sink.commit(results(3, 3, bad={5}))
    sink.finish()
    assert [r["id"] for r in read_results(paths.output)] == ["r0", "r2", "r3", "r4"]
    errors = [orjson.loads(line) for line in paths.errors.read_text().splitlines()]
    assert [(e["id"], e["row"], e["error"]["message"]) for e in errors] == [("r1", 2, "bad 1"), ("r5", 6, "bad 5")]
    assert not paths.progress.exists()


def test_resume_cuts_off_what_was_written_after_the_last_commit(tmp_path):
    paths = paths_for(tmp_path)
    sink = ResultSink.start(paths, Progress("in", "digits", 6), overwrite=False)
    sink.commit(results(0, 2))
    sink.close()
    # A killed job: a chunk's lines half written, its progress never recorded.
    with paths.output.open("ab") as out:
        out.write(b'{"id":"r2","prediction":{"label":2}}\n{"id":"r3","predi')
    with paths.errors.open("ab") as out:
        out.write(b'{"id":"r4"')
    resumed = ResultSink.resume(paths, "in", "digits", 6)
    assert resumed.progress.rows_done == 2
    resumed.commit(results(2, 4, bad={4}))
    resumed.finish()
    assert [r["id"] for r in read_results(paths.output)] == ["r0", "r1", "r2", "r3", "r5"]
    assert [orjson.loads(line)["id"] for line in paths.errors.read_text().splitlines()] == ["r4"]


def test_resume_refuses_another_input_and_a_finished_or_missing_job(tmp_path):
    paths = paths_for(tmp_path)
    ResultSink.start(paths, Progress("in", "digits", 6), overwrite=False).close()
    with pytest.raises(OutputError, match="belongs to a job on in"):
        ResultSink.resume(paths, "other", "digits", 6)
    with pytest.raises(OutputError, match="nothing to resume"):
        ResultSink.resume(paths_for(tmp_path, "never.jsonl"), "in", "digits", 6)


def test_an_existing_output_is_kept_unless_overwrite_is_asked(tmp_path):
    paths = paths_for(tmp_path)
    paths.output.write_text("precious\n")
    with pytest.raises(OutputError, match="--resume .* or --overwrite"):
        ResultSink.start(paths, Progress("in", "digits", 1), overwrite=False)
    assert paths.output.read_text() == "precious\n"
    ResultSink.start(paths, Progress("in", "digits", 1), overwrite=True).close()
    assert paths.output.read_text() == ""


def test_parquet_output_is_written_once_every_row_is_done(tmp_path):
    paths = paths_for(tmp_path, "out.parquet")
    sink = ResultSink.start(paths, Progress("in", "digits", 4), overwrite=False)
    sink.commit(results(0, 4, bad={2}))
    assert not paths.output.exists() and paths.lines.exists()
    sink.finish()
    assert read_results(paths.output) == [{"id": f"r{i}", "prediction": {"label": i}} for i in (0, 1, 3)]
    assert not paths.lines.exists() and paths.errors.name == "out.errors.jsonl"
