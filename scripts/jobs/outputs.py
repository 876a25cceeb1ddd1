"""Batch-job outputs: results and errors appended chunk by chunk, in input order, resumable after a kill.

A chunk is committed by appending its lines to the output and errors files, fsyncing both, and only
then replacing `<output>.progress.json` (rows done and both files' byte sizes) atomically. A killed job
leaves at most an uncommitted tail, which --resume cuts off (a half-written last line included) before
it continues with the first row not yet committed: nothing is lost and nothing is written twice.
Parquet output is staged as JSONL next to it and converted once every row is done.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from scripts.errors import ScriptError
from scripts.jobs.inputs import Row

OUTPUT_FORMATS = ("jsonl", "parquet")
PARQUET_BATCH = 50_000


class OutputError(ScriptError):
    """The output cannot be started or resumed as asked: says why and what to do instead."""


@dataclass(slots=True)
class RowResult:
    """What became of one input row: a prediction, or an error saying why the row was rejected. Not frozen, like
    Row (scripts/jobs/inputs.py): one per row; nothing changes it."""

    row: Row
    prediction: Any = None
    error: dict | None = None


@dataclass
class Progress:
    """The committed state, persisted after every chunk; the only thing --resume trusts."""

    input: str
    model: str
    total: int
    rows_done: int = 0
    predicted: int = 0
    failed: int = 0
    output_bytes: int = 0
    errors_bytes: int = 0


@dataclass(frozen=True)
class OutputPaths:
    output: Path
    errors: Path

    @property
    def format(self) -> str:
        return "parquet" if self.output.suffix.lower() in (".parquet", ".pq") else "jsonl"

    @property
    def lines(self) -> Path:
        """Where result lines are appended: the output itself, or a staging file for Parquet."""
        return self.output if self.format == "jsonl" else self.output.with_name(self.output.name + ".partial.jsonl")

    @property
    def progress(self) -> Path:
        return self.output.with_name(self.output.name + ".progress.json")


def default_errors_path(output: Path) -> Path:
    """out.jsonl -> out.errors.jsonl, out.parquet -> out.errors.jsonl."""
    return output.with_name(f"{output.stem}.errors.jsonl")


class ResultSink:
    """Appends committed chunks to the output and errors files; see the module docstring for the protocol."""

    def __init__(self, paths: OutputPaths, progress: Progress) -> None:
        self.paths = paths
        self.progress = progress
        self._lines = open(paths.lines, "ab")
        self._errors = open(paths.errors, "ab")

    @classmethod
    def start(cls, paths: OutputPaths, progress: Progress, overwrite: bool) -> ResultSink:
        existing = [p for p in (paths.output, paths.lines, paths.progress) if p.exists()]
        if existing and not overwrite:
            raise OutputError(f"{existing[0]} already exists: pass --resume to continue that job or --overwrite to start over")
        paths.output.parent.mkdir(parents=True, exist_ok=True)
        for path in (paths.output, paths.lines, paths.errors):
            path.unlink(missing_ok=True)
        paths.lines.touch()
        paths.errors.touch()
        _write_progress(paths.progress, progress)
        return cls(paths, progress)

    @classmethod
    def resume(cls, paths: OutputPaths, input: str, model: str, total: int) -> ResultSink:
        if not paths.progress.exists():
            hint = "it is complete or was not written by batch_job" if paths.output.exists() else "no job was started there"
            raise OutputError(
                f"nothing to resume: {paths.progress} is missing ({hint}); "
                f"run without --resume (add --overwrite to replace {paths.output})"
            )
        progress = Progress(**orjson.loads(paths.progress.read_bytes()))
        if (progress.input, progress.model, progress.total) != (input, model, total):
            raise OutputError(
                f"{paths.output} belongs to a job on {progress.input} ({progress.total} rows, model {progress.model}), "
                f"not {input} ({total} rows, model {model}); resume with the same input and model or use --overwrite"
            )
        # Anything past the committed sizes is a chunk the killed job never finished committing.
        _truncate(paths.lines, progress.output_bytes)
        _truncate(paths.errors, progress.errors_bytes)
        return cls(paths, progress)

    def commit(self, results: list[RowResult]) -> None:
        """Append one chunk's results (in input order) durably, then record the new committed state."""
        predicted = [_result_line(r) for r in results if r.error is None]
        failed = [_error_line(r) for r in results if r.error is not None]
        self.progress.output_bytes += _append(self._lines, predicted)
        self.progress.errors_bytes += _append(self._errors, failed)
        self.progress.rows_done += len(results)
        self.progress.predicted += len(predicted)
        self.progress.failed += len(failed)
        _write_progress(self.paths.progress, self.progress)

    def finish(self) -> None:
        """Every row is committed: write the Parquet file if asked, drop the progress and empty errors files."""
        self.close()
        if self.paths.format == "parquet":
            write_parquet(self.paths.lines, self.paths.output)
            self.paths.lines.unlink()
        if self.paths.errors.stat().st_size == 0:
            self.paths.errors.unlink()
        self.paths.progress.unlink()

    def close(self) -> None:
        self._lines.close()
        self._errors.close()


def _result_line(result: RowResult) -> bytes:
    return orjson.dumps({"id": result.row.id, "prediction": result.prediction}, option=orjson.OPT_SERIALIZE_NUMPY)


def _error_line(result: RowResult) -> bytes:
    # `row` is the 1-based position in the input, so a row without a useful id can still be found.
    record = {"id": result.row.id, "row": result.row.index + 1, "error": result.error}
    return orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY)


def _append(handle, lines: list[bytes]) -> int:
    if not lines:
        return 0
    data = b"\n".join(lines) + b"\n"
    handle.write(data)
    handle.flush()
    os.fsync(handle.fileno())
    return len(data)


def _write_progress(path: Path, progress: Progress) -> None:
    # Written beside and renamed over: a kill leaves either the old or the new state, never half of one.
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        handle.write(orjson.dumps(asdict(progress)))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _truncate(path: Path, size: int) -> None:
    if not path.exists() or path.stat().st_size < size:
        raise OutputError(f"{path} is shorter than the {size} bytes its progress file records: it was changed; use --overwrite")
    with open(path, "r+b") as handle:
        handle.truncate(size)


# -- reading results back -------------------------------------------------------------------------


def read_results(path: Path) -> list[dict]:
    """All result records of a finished output (JSONL or Parquet), in order: for checks and reports."""
    if path.suffix.lower() in (".parquet", ".pq"):
        return pq.read_table(path).to_pylist()
    return list(_jsonl_records(path))


def _jsonl_records(path: Path) -> Iterator[dict]:
    with path.open("rb") as lines:
        for line in lines:
            if line.strip():
                yield orjson.loads(line)


def write_parquet(lines: Path, target: Path) -> None:
    """Staged result lines -> one Parquet file (id, prediction), written beside the target and renamed."""
    ids_are_ints = all(isinstance(record["id"], int) for record in _jsonl_records(lines))
    temporary = target.with_name(target.name + ".tmp")
    writer = None
    batch: list[dict] = []
    for record in _jsonl_records(lines):
        batch.append(record if ids_are_ints else {**record, "id": str(record["id"])})
        if len(batch) == PARQUET_BATCH:
            writer = _write_batch(writer, temporary, batch)
            batch = []
    if batch or writer is None:
        writer = _write_batch(writer, temporary, batch)
    writer.close()
    os.replace(temporary, target)


def _write_batch(writer: pq.ParquetWriter | None, path: Path, records: list[dict]) -> pq.ParquetWriter:
    if writer is None:
        schema = pa.Table.from_pylist(records).schema if records else pa.schema([("id", pa.string()), ("prediction", pa.null())])
        writer = pq.ParquetWriter(path, schema)
    writer.write_table(pa.Table.from_pylist(records, schema=writer.schema))
    return writer
