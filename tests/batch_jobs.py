"""What the batch-job tests share (unit: in-process; integration: through a server): a digits job, an input
file with some of its lines replaced by bad rows, a job's command line, and the check that two runs agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.digits.samples import DigitRows, write_jsonl
from scripts.jobs.batch_job import JobConfig


def with_bad_lines(path: Path, rows: DigitRows, bad: dict[int, bytes]) -> Path:
    """`rows` written as JSONL to `path`, line i (0-based) replaced by bad[i]."""
    lines = write_jsonl(path, rows).read_bytes().splitlines()
    for index, line in bad.items():
        lines[index] = line
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def digits_job(input: Path, output: Path, **options) -> JobConfig:
    """A digits job, no progress bar; `options` say where it runs (on_server(...), or in_process with an archive)."""
    return JobConfig(model="digits", input=input, output=output, progress_bar=False, **options)


def on_server(server) -> dict[str, Path]:
    """A job's options for a test server (a session's or the faults'): its config.properties and key_file.json."""
    return {"config": server.server.config, "key_file": server.endpoints.key_file}


def job_args(input: Path, output: Path, *options: str, model: str = "digits", keep_priority: bool = True) -> list[str]:
    """`python -m scripts.jobs.batch_job`'s arguments for one job. keep_priority: with --normal-priority, as tests call
    main() in their own process, which could not come back from idle priority to run the tests after it."""
    kept = ["--normal-priority"] if keep_priority else []
    return ["--model", model, "--input", str(input), "--output", str(output), *kept, *options]


def assert_same(records, expected):
    assert [r["id"] for r in records] == [e["id"] for e in expected]
    assert [r["prediction"]["label"] for r in records] == [e["prediction"]["label"] for e in expected]
    np.testing.assert_allclose(
        [r["prediction"]["scores"] for r in records], [e["prediction"]["scores"] for e in expected], atol=1e-6
    )
