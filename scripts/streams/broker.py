"""What the stream consumer needs from a broker, as a small interface: Kafka implements it (scripts/streams/kafka.py).

A broker here is a partitioned input topic read by a consumer group, an output topic and a dead-letter topic
with the same partitions (a record's result goes to the partition it came from), offsets committed per
partition, and one query that makes the output idempotent: which record ids already have a result or a dead
letter past the committed offset (written by a consumer that died before it could commit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from scripts.errors import ScriptError


class BrokerError(ScriptError):
    """The broker cannot be used as asked (unreachable, topics missing or mismatched): the message says what to fix."""


@dataclass(frozen=True)
class Record:
    """One input record: `id` is its key (or topic:partition:offset without one), `value` the item as JSON."""

    id: str
    value: bytes
    timestamp_ms: int | None
    partition: int
    offset: int


@dataclass(frozen=True)
class Outcome:
    """What is written for one record: its result on the output topic, or its error on the dead-letter topic."""

    record: Record
    body: bytes
    dead_letter: bool


@dataclass
class Assignment:
    """A partition this consumer now reads: where its committed offset is, and the ids already answered past it."""

    partition: int
    committed: int
    answered: set[str]


class Broker(Protocol):
    """A consumer group member plus a producer; `on_assigned`/`on_revoked` are called from inside `poll`."""

    on_assigned: Callable[[list[Assignment]], None]
    on_revoked: Callable[[list[int]], None]

    def poll(self, limit: int, timeout: float) -> list[Record]: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def write(self, outcomes: list[Outcome]) -> None:
        """Every outcome durably written (acknowledged by the broker) when this returns."""

    def commit(self, offsets: dict[int, int]) -> None:
        """Per partition, the offset of the next record to read; everything before it is done."""

    def lag(self) -> int:
        """Records in the assigned partitions not committed yet."""

    def close(self) -> None: ...
