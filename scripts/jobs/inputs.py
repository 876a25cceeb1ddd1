"""Batch-job inputs: JSONL, CSV, Parquet or a folder of images, read lazily as Rows in file order.

Every reader yields the same thing, so the job never cares where rows came from:
- JSONL: one object per line, {"id": ..., "instance": <item>}; id defaults to the line number (1-based).
- CSV: an `instance` column (JSON text when it starts with [ or {, else the plain string) or, without
  one, every column except `id` as one list of numbers (e.g. 64 pixel columns); id defaults to the data
  row number (1-based, header not counted).
- Parquet: the same columns as CSV, with list/struct/string `instance` values taken as they are.
- A folder: every image file below it, in sorted path order, as {"b64": ...}; id is the relative path.
"""

from __future__ import annotations

import base64
import csv
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from scripts.errors import ScriptError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
FORMATS = ("jsonl", "csv", "parquet", "images")


class InputError(ScriptError):
    """The input cannot be read as a batch job: says which row and what is allowed."""


@dataclass(slots=True)
class Row:
    """One input row: its position in the input (0-based), the user's id and the item to predict.

    `problem` says why a row could not even be read (a broken JSON line): it goes to the errors file
    like a row the model rejected, and the job goes on. Not frozen: one is built per row, and a frozen
    dataclass's __init__ (object.__setattr__ per field) costs 4x a plain one. Nothing changes a Row but
    Chunk.rows_with_instances, which fills in an instance left None by a columnar reader.
    """

    index: int
    id: Any
    instance: Any
    problem: str | None = None


@dataclass(slots=True)
class Chunk:
    """Consecutive rows of the input, cut for one request or forward pass. `instances` holds their instances as one
    (rows, values) array when the reader had them so (numeric Parquet): a decoder takes the chunk in one pass, and no
    numpy row object is made per row (docs/batch-jobs.md, "Throughput"); the rows' own `instance` is then None
    until `rows_with_instances()` gives each its row of the array, for code that takes rows one by one."""

    rows: list[Row]
    instances: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def rows_with_instances(self) -> list[Row]:
        if self.instances is not None and self.rows and self.rows[0].instance is None:
            for row, instance in zip(self.rows, self.instances, strict=True):
                row.instance = instance
        return self.rows

    def part(self, start: int, stop: int) -> Chunk:
        return Chunk(self.rows[start:stop], None if self.instances is None else self.instances[start:stop])

    @staticmethod
    def joined(chunks: list[Chunk]) -> Chunk:
        """One chunk of these in order; its instances stay one array when every part has one of the same kind."""
        if len(chunks) == 1:
            return chunks[0]
        arrays = [chunk.instances for chunk in chunks]
        if all(a is not None for a in arrays) and len({(a.shape[1:], a.dtype) for a in arrays}) == 1:
            return Chunk([row for chunk in chunks for row in chunk.rows], np.concatenate(arrays))
        return Chunk([row for chunk in chunks for row in chunk.rows_with_instances()])


@dataclass(frozen=True)
class RowSource:
    """An input file or folder: how many rows it holds (for progress) and its rows, lazily, in order."""

    path: Path
    format: str

    def count(self) -> int:
        return _COUNTERS[self.format](self.path)

    def rows(self, skip: int = 0) -> Iterator[Row]:
        """Rows from position `skip` on: a resumed job starts after the rows it already wrote."""
        return itertools.islice(_READERS[self.format](self.path), skip, None)

    def chunks(self, size: int, skip: int = 0) -> Iterator[Chunk]:
        """The rows from position `skip` on in chunks of `size` (the last may be shorter): the same rows, cut at the
        same places, whatever the format; Parquet's numeric rows come with their instances as one array."""
        if self.format == "parquet":
            return _regrouped(_skipped(_parquet_pieces(self.path), skip), size)
        return _cut(self.rows(skip), size)


def _cut(rows: Iterator[Row], size: int) -> Iterator[Chunk]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield Chunk(chunk)
            chunk = []
    if chunk:
        yield Chunk(chunk)


def _skipped(pieces: Iterator[Chunk], skip: int) -> Iterator[Chunk]:
    for piece in pieces:
        if skip >= len(piece):
            skip -= len(piece)
            continue
        yield piece.part(skip, len(piece)) if skip else piece
        skip = 0


def _regrouped(pieces: Iterator[Chunk], size: int) -> Iterator[Chunk]:
    """Pieces of any length (a reader's record batches) as chunks of exactly `size` rows, the last shorter. Each
    chunk is made of parts of the pieces it spans, so only a chunk that spans a piece without an array has none."""
    pending: deque[Chunk] = deque()
    held = offset = 0  # rows waiting in `pending`; rows of pending[0] already given out

    def take(count: int) -> Chunk:
        nonlocal offset
        parts = []
        while count:
            piece = pending[0]
            step = min(count, len(piece) - offset)
            if step:
                parts.append(piece.part(offset, offset + step))
            offset, count = offset + step, count - step
            if offset == len(piece):
                pending.popleft()
                offset = 0
        return Chunk.joined(parts)

    for piece in pieces:
        pending.append(piece)
        held += len(piece)
        while held >= size:
            yield take(size)
            held -= size
    if held:
        yield take(held)


def open_input(path: Path, format: str | None = None) -> RowSource:
    if not path.exists():
        raise InputError(f"input {path} does not exist")
    chosen = format or detect_format(path)
    if chosen not in FORMATS:
        raise InputError(f"unknown input format {chosen!r}; use one of {', '.join(FORMATS)}")
    return RowSource(path, chosen)


def detect_format(path: Path) -> str:
    if path.is_dir():
        return "images"
    suffix = path.suffix.lower()
    by_suffix = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
    if suffix not in by_suffix:
        raise InputError(
            f"cannot tell the format of {path.name}: use .jsonl, .csv, .parquet, a folder of images, or --input-format"
        )
    return by_suffix[suffix]


# -- JSONL ----------------------------------------------------------------------------------------


def _jsonl_rows(path: Path) -> Iterator[Row]:
    index = 0
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue  # blank lines (a trailing newline, spacing) are not rows
            yield _jsonl_row(index, number, line)
            index += 1


def _jsonl_row(index: int, number: int, line: bytes) -> Row:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        return Row(index, number, None, problem=f"line {number} is not valid JSON: {error}")
    if not isinstance(record, dict) or "instance" not in record:
        got = line.decode("utf-8", errors="replace").strip()[:80]
        return Row(index, number, None, problem=f'line {number}: expected an object {{"id": ..., "instance": <item>}}, got {got}')
    return Row(index, record.get("id", number), record["instance"])


def _jsonl_count(path: Path) -> int:
    with path.open("rb") as lines:
        return sum(1 for line in lines if line.strip())


# -- CSV ------------------------------------------------------------------------------------------


def _csv_rows(path: Path) -> Iterator[Row]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header:
            raise InputError(f"{path} is empty: expected a header row naming the columns")
        to_instance = _csv_instance_builder(path, header)
        id_column = header.index("id") if "id" in header else None
        for index, cells in enumerate(reader):
            row_id = cells[id_column] if id_column is not None and id_column < len(cells) else index + 1
            if len(cells) != len(header):
                yield Row(
                    index, row_id, None, problem=f"data row {index + 1} has {len(cells)} cells, the header has {len(header)}"
                )
                continue
            try:
                yield Row(index, row_id, to_instance(cells))
            except ValueError as error:
                yield Row(index, row_id, None, problem=f"data row {index + 1}: {error}")


def _csv_instance_builder(path: Path, header: list[str]):
    if "instance" in header:
        column = header.index("instance")
        return lambda cells: _text_or_json(cells[column])
    columns = [i for i, name in enumerate(header) if name != "id"]
    if not columns:
        raise InputError(f"{path}: expected an 'instance' column or value columns besides 'id', got {header}")

    def numbers(cells: list[str]) -> list[float | int]:
        try:
            return [_number(cells[i]) for i in columns]
        except ValueError:
            raise ValueError(f"without an 'instance' column every column but 'id' must be a number, got {cells[:8]}...") from None

    return numbers


def _text_or_json(cell: str) -> Any:
    # A JSON list or object (an 8x8 grid, {"b64": ...}) is parsed; any other cell is an item of text.
    if cell.lstrip()[:1] in ("[", "{"):
        try:
            return orjson.loads(cell)
        except orjson.JSONDecodeError:
            pass
    return cell


def _number(cell: str) -> float | int:
    try:
        return int(cell)
    except ValueError:
        return float(cell)


def _csv_count(path: Path) -> int:
    with path.open(newline="", encoding="utf-8") as handle:
        return max(0, sum(1 for _ in csv.reader(handle)) - 1)


# -- Parquet --------------------------------------------------------------------------------------


def _parquet_rows(path: Path) -> Iterator[Row]:
    for piece in _parquet_pieces(path):
        yield from piece.rows_with_instances()


def _parquet_pieces(path: Path) -> Iterator[Chunk]:
    """The file's rows a record batch at a time; a batch of numeric rows as its matrix (its rows' instances left to
    Chunk.rows_with_instances)."""
    table = pq.ParquetFile(path)
    names = table.schema_arrow.names
    value_columns = [name for name in names if name != "id"]
    if "instance" not in names and not value_columns:
        raise InputError(f"{path}: expected an 'instance' column or value columns besides 'id', got {names}")
    index = 0
    for batch in table.iter_batches(batch_size=4096):
        matrix = _numeric_matrix(batch, value_columns)
        if matrix is not None:
            # Each row's instance is its row of the batch's matrix, no Python number per value: 4-7 us a digits row
            # less to read and decode than lists (docs/batch-jobs.md, "Throughput").
            ids = batch.column("id").to_pylist() if "id" in names else range(index + 1, index + 1 + batch.num_rows)
            yield Chunk([Row(index + offset, row_id, None) for offset, row_id in enumerate(ids)], matrix)
            index += batch.num_rows
            continue
        data = batch.to_pydict()
        ids = data.get("id")
        rows = []
        for offset in range(batch.num_rows):
            if "instance" in data:
                instance = data["instance"][offset]
            else:
                instance = [data[name][offset] for name in value_columns]
            rows.append(Row(index, ids[offset] if ids is not None else index + 1, instance))
            index += 1
        yield Chunk(rows)


def _numeric_matrix(batch: pa.RecordBatch, value_columns: list[str]) -> np.ndarray | None:
    """The batch's instances as one (rows, values) numpy array, when they are numbers without nulls, as many per row:
    an `instance` column of lists of ints or floats, or (without one) value columns of one numeric type. None for
    anything else (text, structs, nulls, ragged lists, mixed column types): those rows are read as Python values.

    The rows' values are the ones the Python path gives (int64 stays integral, float64 stays float), so a decoder
    that rejects a value names it the same way."""
    if "instance" in batch.schema.names:
        column = batch.column("instance")
        kind = column.type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
            return None
        if not _is_number(kind.value_type) or column.null_count or batch.num_rows == 0:
            return None
        values = column.flatten()
        lengths = pc.list_value_length(column)
        width = lengths[0].as_py()
        if values.null_count or pc.min_max(lengths).as_py() != {"min": width, "max": width}:
            return None
        return values.to_numpy().reshape(batch.num_rows, width)
    columns = [batch.column(name) for name in value_columns]
    if len({column.type for column in columns}) != 1 or not _is_number(columns[0].type) or batch.num_rows == 0:
        return None
    if any(column.null_count for column in columns):
        return None
    return np.column_stack([column.to_numpy() for column in columns])


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _parquet_count(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


# -- image folders --------------------------------------------------------------------------------


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _image_rows(folder: Path) -> Iterator[Row]:
    for index, file in enumerate(_image_files(folder)):
        encoded = base64.b64encode(file.read_bytes()).decode("ascii")
        yield Row(index, file.relative_to(folder).as_posix(), {"b64": encoded})


def _image_count(folder: Path) -> int:
    return len(_image_files(folder))


_READERS = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows, "images": _image_rows}
_COUNTERS = {"jsonl": _jsonl_count, "csv": _csv_count, "parquet": _parquet_count, "images": _image_count}
