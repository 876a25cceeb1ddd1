"""The bulk bench's pieces that need no server: a job's input from a model's samples, its output checked row by row
against them, and a partial run keeping the other models' rows of its region."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest

from models import registry
from scripts.bench import bulk
from scripts.errors import ScriptError
from scripts.jobs.batch_job import JobSummary


def summary(output: Path, total: int, failed: int = 0) -> JobSummary:
    return JobSummary("test", total, 0, total - failed, failed, 1.0, output, output.with_suffix(".errors"))


@pytest.mark.parametrize("name", sorted(registry.models()))
def test_a_jobs_input_cycles_through_the_samples_and_their_answers_check_it(tmp_path, name):
    found = registry.model(name)
    samples = found.samples()
    rows = len(samples.instances) + 3
    source = bulk.write_input(found, rows, tmp_path / "in.jsonl")
    lines = [orjson.loads(line) for line in source.read_bytes().splitlines()]
    assert [line["id"] for line in lines] == list(range(rows))
    assert lines[len(samples.instances)]["instance"] == samples.instances[0]
    output = tmp_path / "out.jsonl"
    answers = [{"id": n, "prediction": samples.answers[n % len(samples.answers)]} for n in reversed(range(rows))]
    output.write_bytes(b"".join(orjson.dumps(a) + b"\n" for a in answers))
    bulk.check_output(found, summary(output, rows), rows)  # any order, each row once with its sample's answer
    output.write_bytes(b"".join(orjson.dumps(a) + b"\n" for a in answers[1:]))
    with pytest.raises(ScriptError, match=f"{rows - 1} rows answered"):
        bulk.check_output(found, summary(output, rows), rows)
    output.write_bytes(b"".join(orjson.dumps(a) + b"\n" for a in [*answers, answers[0]]))
    with pytest.raises(ScriptError, match="answered twice"):
        bulk.check_output(found, summary(output, rows), rows)


def test_a_row_with_another_samples_answer_is_named(tmp_path):
    found = registry.model("efficientnet_lite0")
    path = tmp_path / "out.jsonl"
    path.write_bytes(orjson.dumps({"id": 0, "prediction": found.samples().answers[1]}) + b"\n")
    with pytest.raises(ScriptError, match="row 0 .*top_k"):
        bulk.check_output(found, summary(path, 1), 1)


def test_the_chunk_is_the_bulk_lanes_own_row_limit_at_most_1000():
    assert bulk.chunk_size(registry.model("efficientnet_lite0")) == 256  # model-config.yaml: 256 images a bulk request
    assert bulk.chunk_size(registry.model("digits")) == bulk.MAX_CHUNK


def test_a_partial_run_keeps_the_rows_of_the_models_it_did_not_run():
    page = (
        "text\n<!-- bulk lanes: begin -->\n| model | measured | rows |\n| --- | --- | ---: |\n"
        "| digits | 2026-12-01 | 10 |\n| minilm | 2026-12-02 | 20 |\n<!-- bulk lanes: end -->\n"
    )
    assert bulk.kept_rows(page, {"digits"}) == ["| minilm | 2026-12-02 | 20 |"]
    assert bulk.kept_rows("no region here", {"digits"}) == []


def test_the_bulk_lanes_p50_and_p99_are_its_requests_own(tmp_path):
    output = tmp_path / "out.jsonl"
    result = bulk.BulkResult("digits", 10, 5)
    assert result.request_ms() == "n/a"  # no request timed: said, not a zero
    # Two rounds of 100 requests: 1..100 ms and 101..200 ms; the percentiles are over all 200 together.
    for first in (1, 101):
        seconds = tuple(ms / 1000 for ms in range(first, first + 100))
        result.served.append(dataclasses.replace(summary(output, 10), request_seconds=seconds))
    assert result.request_ms() == "101 / 199 (200)"
