"""The stream consumer's loop: records from a Broker, through a lane (or the in-process core), one outcome each.

- Records polled together are sent as one `{"instances": [...]}` request of at most `batch_records`, up to
  `concurrency` requests at a time, with the batch jobs' retries and bad-row isolation (scripts/jobs/chunks.py):
  a lane that answers 503 (queue full) or not at all (restarting) is retried with backoff for as long as
  `retry.patience`, the records stay in flight, and no more are read meanwhile.
- In flight: records read but not committed, at most `max_in_flight`; at the bound the partitions are paused.
- Commit: a partition's offset moves past a record only once the record's outcome (result or dead letter) and
  those of all records before it are acknowledged by the broker.
- A record whose id the broker reports as already answered past the commit (a consumer died between writing and
  committing) is skipped, not answered again.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson

from scripts.jobs.chunks import RetryPolicy, run_chunk
from scripts.jobs.inputs import Row
from scripts.jobs.outputs import RowResult
from scripts.jobs.runners import Reply
from scripts.streams.broker import Assignment, Broker, Outcome, Record
from scripts.streams.stats import StreamStats

Send = Callable[[list[Any]], Reply]
# The dead letter keeps at most this much of the record's value (it is there to identify the record).
DEAD_VALUE_CHARS = 4096


@dataclass(frozen=True)
class StreamSettings:
    batch_records: int = 64
    concurrency: int = 4
    max_in_flight: int = 1024
    linger: float = 0.005  # seconds a partial batch waits for more records while requests are in flight
    idle_exit: float | None = None  # stop after this long with nothing to read and nothing in flight
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(patience=float("inf")))
    stats_every: float = 10.0

    def check(self) -> None:
        for name in ("batch_records", "concurrency", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.max_in_flight < self.batch_records:
            raise ValueError(f"--max-in-flight ({self.max_in_flight}) must be at least --batch-records ({self.batch_records})")


class Ledger:
    """Per partition, the offsets read in order and whether each is done; tells the offset to commit."""

    def __init__(self) -> None:
        self._partitions: dict[int, deque[list]] = {}
        self._committed: dict[int, int] = {}
        self.outstanding = 0

    def assign(self, partition: int, committed: int) -> None:
        self._partitions[partition] = deque()
        self._committed[partition] = committed

    def drop(self, partition: int) -> None:
        self.outstanding -= sum(1 for entry in self._partitions.pop(partition, ()) if not entry[1])
        self._committed.pop(partition, None)

    def read(self, record: Record) -> list:
        entry = [record.offset, False]
        self._partitions.setdefault(record.partition, deque()).append(entry)
        self.outstanding += 1
        return entry

    def done(self, entry: list) -> None:
        if not entry[1]:
            entry[1] = True
            self.outstanding -= 1

    def commits(self) -> dict[int, int]:
        """Partitions whose committable offset moved since the last call, with that offset."""
        moved = {}
        for partition, entries in self._partitions.items():
            last = None
            while entries and entries[0][1]:
                last = entries.popleft()[0]
            if last is not None and last + 1 > self._committed.get(partition, -1):
                moved[partition] = self._committed[partition] = last + 1
        return moved


class StreamConsumer:
    def __init__(
        self, broker: Broker, send: Send, settings: StreamSettings, stats: StreamStats, report: Callable[[StreamStats], None]
    ) -> None:
        settings.check()
        self.broker = broker
        self.send = send
        self.settings = settings
        self.stats = stats
        self.report = report
        self.ledger = Ledger()
        self._answered: dict[int, set[str]] = {}
        self._entries: dict[tuple[int, int], list] = {}
        self._pending: list[Record] = []
        self._pending_since = 0.0
        self._futures: list[Future] = []
        self._sequence = itertools.count()
        self._assigned_at: float | None = None  # idle time counts from the first assignment (joining takes seconds)
        self._pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="stream")
        broker.on_assigned = self._assigned
        broker.on_revoked = self._revoked

    def run(self, stop: threading.Event) -> StreamStats:
        """Consume until `stop` is set (or idle_exit passes); in-flight records are finished and committed."""
        last_record = last_report = time.monotonic()
        try:
            while not stop.is_set():
                self._finish(block=False)
                room = self.settings.max_in_flight - self.ledger.outstanding
                self.broker.pause() if room <= 0 else self.broker.resume()
                busy = bool(self._futures or self._pending)
                records = self.broker.poll(min(max(room, 1), self.settings.batch_records), 0.02 if busy else 0.2)
                now = time.monotonic()
                if records or busy or room <= 0:
                    # Idle time counts only with nothing read, nothing in flight and nothing held back: after a
                    # long outage (TorchServe restarting under load) the first empty poll is not idleness.
                    last_record = now
                if records:
                    self._take(records)
                self._dispatch(flush=not records)
                self._commit()
                if now - last_report >= self.settings.stats_every:
                    self._report()
                    last_report = now
                idle = self.settings.idle_exit
                quiet = now - max(last_record, self._assigned_at or now)
                if idle is not None and self._assigned_at is not None and not busy and not records and quiet >= idle:
                    break
            self._dispatch(flush=True)
            self._finish(block=True)
            self._commit()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._report()
        return self.stats

    # --- records in --------------------------------------------------------------------------------------------
    def _take(self, records: list[Record]) -> None:
        if self.stats.first_record_at is None:
            self.stats.first_record_at = time.monotonic()
        for record in records:
            self.stats.records_in += 1
            entry = self.ledger.read(record)
            answered = self._answered.get(record.partition)
            if answered and record.id in answered:
                answered.discard(record.id)
                self.stats.duplicates_skipped += 1
                self.ledger.done(entry)
                continue
            self._entries[(record.partition, record.offset)] = entry
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append(record)

    def _dispatch(self, flush: bool) -> None:
        """Send full batches; a partial one when nothing more came, or it waited `linger` while requests run."""
        size = self.settings.batch_records
        while len(self._pending) >= size:
            self._submit(self._pending[:size])
            self._pending = self._pending[size:]
        waited = time.monotonic() - self._pending_since
        if self._pending and (flush or not self._futures or waited >= self.settings.linger):
            self._submit(self._pending)
            self._pending = []

    def _submit(self, records: list[Record]) -> None:
        self._futures.append(self._pool.submit(self._answer, records))

    def _answer(self, records: list[Record]) -> list[Outcome]:
        rows = [_row(next(self._sequence), record) for record in records]
        results = run_chunk(self.send, rows, self.settings.retry)
        return [_outcome(record, result) for record, result in zip(records, results, strict=True)]

    # --- outcomes out --------------------------------------------------------------------------------------------
    def _finish(self, block: bool) -> None:
        """Write the outcomes of finished requests (all of them when `block`), then mark their records done."""
        while self._futures:
            done = [future for future in self._futures if future.done()]
            if not done and not block:
                return
            if not done:
                done = [self._futures[0]]
            for future in done:
                self._futures.remove(future)
                outcomes = future.result()  # a JobError (bad token, no such lane) stops the consumer here
                self.broker.write(outcomes)
                now_ms = time.time() * 1000
                self.stats.last_outcome_at = time.monotonic()
                for outcome in outcomes:
                    record = outcome.record
                    self.ledger.done(self._entries.pop((record.partition, record.offset)))
                    self.stats.observe_latency(record.timestamp_ms, now_ms)
                    if outcome.dead_letter:
                        self.stats.dead_letters += 1
                    else:
                        self.stats.results += 1

    def _commit(self) -> None:
        self.broker.commit(self.ledger.commits())

    # --- group membership ------------------------------------------------------------------------------------------
    def _assigned(self, assignments: list[Assignment]) -> None:
        self._assigned_at = time.monotonic()
        for assignment in assignments:
            self.ledger.assign(assignment.partition, assignment.committed)
            self._answered[assignment.partition] = set(assignment.answered)

    def _revoked(self, partitions: list[int]) -> None:
        # Finish what was read from them, so the next owner starts right after it: no record answered twice.
        self._dispatch(flush=True)
        self._finish(block=True)
        self._commit()
        for partition in partitions:
            self.ledger.drop(partition)
            self._answered.pop(partition, None)

    def _report(self) -> None:
        try:
            self.stats.lag = self.broker.lag()
        except Exception:  # noqa: BLE001 - a figure only: a slow broker must not stop the stream
            pass
        self.report(self.stats)


def _row(sequence: int, record: Record) -> Row:
    try:
        return Row(index=sequence, id=record.id, instance=orjson.loads(record.value))
    except orjson.JSONDecodeError as error:
        return Row(index=sequence, id=record.id, instance=None, problem=f"the record's value is not JSON: {error}")


def _outcome(record: Record, result: RowResult) -> Outcome:
    if result.error is None:
        return Outcome(record, orjson.dumps({"id": record.id, "prediction": result.prediction}), dead_letter=False)
    body = {
        "id": record.id,
        "error": result.error,
        "value": record.value[:DEAD_VALUE_CHARS].decode("utf-8", "replace"),
        "partition": record.partition,
        "offset": record.offset,
    }
    return Outcome(record, orjson.dumps(body), dead_letter=True)
