"""The in-process job as a pipeline: chunks are read and decoded ahead while the core runs the forward pass.

Without it one thread reads a chunk, decodes it, runs it and writes it, so the core idles while the next chunk
is read and decoded (the forward pass is where torch releases the GIL and uses every core). Here:

- a prefetch thread reads rows, cuts chunks and decodes them with the core's own decoder, keeping at most
  `depth` decoded chunks ready (a bounded queue: memory stays flat, whatever the input's size);
- forward workers run `core.predict` over the decoded chunks (collate, forward, unbatch): on the CPU one per
  torch thread, each on one thread (scripts/jobs/batch_job.py forward_workers), on CUDA one (the core pins each
  micro-batch and copies it without blocking, so the copy overlaps the device's work);
- the job's main thread writes and commits results in input order.

Decoding gives the same outcome per row as sending the chunk to the server: a row the decoder rejects fails
alone and the rest of the chunk is decoded again without it, as the server path resends it (request-wide limits,
like the digits pixel budget, then count the same rows).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from handlers.core import InferenceCore
from handlers.decoding import Payload
from handlers.errors import RequestError
from scripts.jobs.chunks import ROW_ERROR
from scripts.jobs.inputs import Chunk, Row
from scripts.jobs.outputs import RowResult

Prepared = TypeVar("Prepared")
_END = object()


@dataclass(frozen=True)
class DecodedChunk:
    """A chunk ready for the forward pass: its rows, those that failed already, and the decoded rest."""

    rows: list[Row]
    failed: dict[int, RowResult]
    decoded_rows: list[Row]
    decoded: list[Any]


def decode_chunk(core: InferenceCore, chunk: Chunk) -> DecodedChunk:
    if chunk.instances is not None:  # numeric rows read as one array (no row can be unreadable): one decoder pass
        try:
            return DecodedChunk(chunk.rows, {}, chunk.rows, core.decode(Payload(items=chunk.instances, raw=False)))
        except RequestError:
            pass  # a bad value: row by row below, which names it and decodes the rest without it
    rows = chunk.rows_with_instances()
    failed = {row.index: RowResult(row, error=_unreadable(row)) for row in rows if row.problem is not None}
    part = [row for row in rows if row.problem is None]
    while part:
        try:
            decoded = core.decode(Payload(items=[row.instance for row in part], raw=False))
        except RequestError as error:
            position, message = _located(error, len(part))
            failed[part[position].index] = RowResult(part[position], error={**error.to_dict(), "message": message})
            part = part[:position] + part[position + 1 :]
            continue
        return DecodedChunk(rows, failed, part, decoded)
    return DecodedChunk(rows, failed, [], [])


def predict_chunk(core: InferenceCore, chunk: DecodedChunk) -> list[RowResult]:
    """Results for every row of the chunk, in the chunk's order."""
    outputs = core.predict(chunk.decoded) if chunk.decoded else []
    if not chunk.failed and not any(isinstance(output, RequestError) for output in outputs):  # every row predicted
        return [RowResult(row, prediction=output) for row, output in zip(chunk.rows, outputs, strict=True)]
    results = dict(chunk.failed)
    for row, output in zip(chunk.decoded_rows, outputs, strict=True):
        if isinstance(output, RequestError):  # a row that does not fit in device memory even alone
            results[row.index] = RowResult(row, error=output.to_dict())
        else:
            results[row.index] = RowResult(row, prediction=output)
    return [results[row.index] for row in chunk.rows]


def prefetched(items: Iterator[Any], prepare: Callable[[Any], Prepared], depth: int) -> Iterator[Prepared]:
    """`prepare(item)` for each item, in order, computed by a thread that keeps at most `depth` results ready.

    An exception in the thread (an unreadable input) is raised here, where the item would have come. Closing the
    generator early (the job stopped) stops the thread after the item it is on.
    """
    if depth < 1:
        raise ValueError(f"prefetch depth must be at least 1, got {depth}")
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def fill() -> None:
        try:
            for item in items:
                if not _put(ready, stop, prepare(item)):
                    return
            _put(ready, stop, _END)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
            _put(ready, stop, error)

    thread = threading.Thread(target=fill, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            prepared = ready.get()
            if prepared is _END:
                return
            if isinstance(prepared, BaseException):
                raise prepared
            yield prepared
    finally:
        stop.set()
        thread.join()


def _put(ready: queue.Queue, stop: threading.Event, item: Any) -> bool:
    """Hand `item` to the consumer, waiting while the queue is full; False once the consumer has stopped."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _located(error: RequestError, size: int) -> tuple[int, str]:
    match = ROW_ERROR.match(error.message)
    if match is None or int(match.group(1)) >= size:
        # The core's decoder names the row of every item error; anything else is a bug to see, not to hide.
        raise RuntimeError(f"the decoder rejected a chunk without naming a row: {error.message}")
    return int(match.group(1)), match.group(2)


def _unreadable(row: Row) -> dict:
    return {"code": 400, "type": "UnreadableRow", "message": row.problem}
