"""The Broker interface over Kafka's protocol with confluent-kafka (librdkafka): any Kafka, or the local Tansu.

- Input: a consumer group member with automatic commits off; offsets are committed by the consumer only after
  the records' outcomes are acknowledged by the broker (acks=all), so a restart re-reads what was not committed.
- Output and dead letters: keyed by the record id, written to the partition the record came from, with the
  record's origin in headers (`source`: topic/partition/offset). On assignment the tail of that partition
  (`scan_depth` records, a bound on what can have been written past the commit) is read back, and the ids found
  there past the committed offset are skipped when they come again: one result per id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from scripts.streams.broker import Assignment, BrokerError, Outcome, Record

SOURCE_HEADER = "source"
# librdkafka's own log lines (a broker gone away, reconnects) go to Python logging, not straight to stderr.
LOG = logging.getLogger("scripts.streams.librdkafka")
# Group membership settings that let a restarted consumer get its partitions within seconds: Tansu (and Kafka)
# hold a rebalance until every known member rejoined or its session expired.
GROUP_SETTINGS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "max.poll.interval.ms": 300000}
TIMEOUT = 30.0
# A commit refused because this member no longer owns the partitions (a rebalance passed it by).
LOST_MEMBERSHIP = {
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError._ASSIGNMENT_LOST,
}


def client_settings(brokers: str) -> dict:
    return {"bootstrap.servers": brokers, "logger": LOG}


def ensure_topics(brokers: str, input_topic: str, outputs: list[str], partitions: int = 4) -> int:
    """Create missing topics (outputs with the input's partition count); return that count. Refuses outputs with
    fewer partitions than the input: a record's outcome goes to the partition number it came from."""
    admin = AdminClient(client_settings(brokers))
    existing = _partition_counts(admin, brokers)
    count = existing.get(input_topic, partitions)
    missing = [name for name in [input_topic, *outputs] if name not in existing]
    if missing:
        futures = admin.create_topics([NewTopic(name, num_partitions=count, replication_factor=1) for name in missing])
        for name, future in futures.items():
            try:
                future.result(TIMEOUT)
            except KafkaException as error:
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise BrokerError(f"cannot create topic {name} on {brokers}: {error}") from None
    for name in outputs:
        if existing.get(name, count) < count:
            raise BrokerError(
                f"topic {name} has {existing[name]} partitions, fewer than the {count} of {input_topic}: each record's "
                "outcome is written to the partition number it came from; recreate it with at least as many"
            )
    return count


def _partition_counts(admin: AdminClient, brokers: str) -> dict[str, int]:
    try:
        metadata = admin.list_topics(timeout=TIMEOUT)
    except KafkaException as error:
        raise BrokerError(f"no Kafka broker answers at {brokers}: {error}") from None
    return {name: len(topic.partitions) for name, topic in metadata.topics.items() if topic.error is None}


class KafkaBroker:
    def __init__(
        self,
        brokers: str,
        group: str,
        input_topic: str,
        output_topic: str,
        dead_letter_topic: str,
        scan_depth: int,
    ) -> None:
        self.brokers = brokers
        self.input_topic = input_topic
        self.output_topic = output_topic
        self.dead_letter_topic = dead_letter_topic
        self.scan_depth = scan_depth
        self.on_assigned: Callable[[list[Assignment]], None] = lambda assignments: None
        self.on_revoked: Callable[[list[int]], None] = lambda partitions: None
        self._partitions: list[int] = []
        self._paused = False
        self._failures: list[str] = []
        self._consumer = Consumer(
            {
                **client_settings(brokers),
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **GROUP_SETTINGS,
            }
        )
        self._producer = Producer({**client_settings(brokers), "acks": "all", "linger.ms": 2})
        self._consumer.subscribe([input_topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked)

    # --- input -----------------------------------------------------------------------------------------------
    def poll(self, limit: int, timeout: float) -> list[Record]:
        records = []
        for message in self._consumer.consume(max(1, limit), timeout):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                if error.fatal() or error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise BrokerError(f"reading {self.input_topic} from {self.brokers}: {error.str()}")
                continue  # transient (a broker reconnect): librdkafka retries by itself
            records.append(_record(message))
        return records

    def pause(self) -> None:
        if not self._paused and self._partitions:
            self._consumer.pause(self._topic_partitions())
        self._paused = True

    def resume(self) -> None:
        if self._paused and self._partitions:
            self._consumer.resume(self._topic_partitions())
        self._paused = False

    def lag(self) -> int:
        behind = 0
        for tp in self._consumer.committed(self._topic_partitions(), timeout=TIMEOUT) if self._partitions else []:
            # The high watermark of the last fetch (see _partition_tail for why not ListOffsets').
            low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:
                low, high = self._consumer.get_watermark_offsets(tp, timeout=TIMEOUT)
            behind += max(0, high - (tp.offset if tp.offset >= 0 else low))
        return behind

    # --- output ----------------------------------------------------------------------------------------------
    def write(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            record = outcome.record
            topic = self.dead_letter_topic if outcome.dead_letter else self.output_topic
            source = f"{self.input_topic}/{record.partition}/{record.offset}".encode()
            while True:
                try:
                    self._producer.produce(
                        topic,
                        key=record.id.encode(),
                        value=outcome.body,
                        partition=record.partition,
                        headers=[(SOURCE_HEADER, source)],
                        on_delivery=self._delivered,
                    )
                    break
                except BufferError:  # the producer's queue is full: let it send some first
                    self._producer.poll(0.05)
        left = self._producer.flush(TIMEOUT)
        if left or self._failures:
            failures, self._failures = self._failures, []
            raise BrokerError(f"{left} outcomes not acknowledged by {self.brokers} within {TIMEOUT:.0f}s; {failures[:3]}")

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._failures.append(f"{message.topic()}[{message.partition()}]: {error.str()}")

    def commit(self, offsets: dict[int, int]) -> None:
        if not offsets:
            return
        tps = [TopicPartition(self.input_topic, partition, offset) for partition, offset in offsets.items()]
        try:
            self._consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as error:
            if error.args[0].code() in LOST_MEMBERSHIP:
                return  # the partitions moved on: their next owner re-reads these records and skips the answered ids
            raise BrokerError(f"committing {self.input_topic} offsets {offsets} at {self.brokers}: {error}") from None

    def close(self) -> None:
        self._producer.flush(TIMEOUT)
        self._consumer.close()

    # --- group membership ------------------------------------------------------------------------------------
    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        self._partitions = sorted(set(self._partitions) | set(numbers))
        committed = {tp.partition: tp.offset for tp in consumer.committed(partitions, timeout=TIMEOUT)}
        starts = {}
        for number in numbers:
            low, _ = consumer.get_watermark_offsets(TopicPartition(self.input_topic, number), timeout=TIMEOUT)
            starts[number] = committed[number] if committed[number] != OFFSET_INVALID and committed[number] >= 0 else low
        answered = self._answered_past(starts)
        assignments = [Assignment(number, start, answered[number]) for number, start in starts.items()]
        if self._paused:
            consumer.pause(partitions)
        self.on_assigned(assignments)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = [tp.partition for tp in partitions]
        self.on_revoked(numbers)
        self._partitions = [number for number in self._partitions if number not in numbers]

    def _topic_partitions(self) -> list[TopicPartition]:
        return [TopicPartition(self.input_topic, number) for number in self._partitions]

    def _answered_past(self, partitions: dict[int, int]) -> dict[int, set[str]]:
        """Per partition, the ids whose result or dead letter came from its committed offset on (either topic)."""
        wanted = [(topic, number) for number in partitions for topic in (self.output_topic, self.dead_letter_topic)]
        answered: dict[int, set[str]] = {number: set() for number in partitions}
        for (_, number), messages in _tails(self.brokers, wanted, self.scan_depth).items():
            for message in messages:
                source = dict(message.headers() or []).get(SOURCE_HEADER, b"").decode()
                source_topic, _, offset = source.rpartition("/")
                if source_topic.startswith(f"{self.input_topic}/") and int(offset) >= partitions[number]:
                    answered[number].add(message.key().decode())
        return answered


def _tails(
    brokers: str, partitions: list[tuple[str, int]], depth: int | None, timeout: float = TIMEOUT
) -> dict[tuple[str, int], list[Message]]:
    """The last `depth` records of each (topic, partition) or more (all when depth is None), read up to its end.

    The end is found by reading until the broker says end of partition, not from ListOffsets: Tansu 0.6 answers
    ListOffsets(latest) with its last batch's base offset + 1 (fetches report the true high watermark). That
    answer is at most one batch short, so starting `depth` before it reads at least the last `depth` records.
    """
    settings = {**client_settings(brokers), "group.id": "stream-tail-reader", "enable.auto.commit": False}
    reader = Consumer({**settings, "enable.partition.eof": True})
    try:
        starts = []
        for topic, number in partitions:
            low, high = reader.get_watermark_offsets(TopicPartition(topic, number), timeout=timeout)
            starts.append(TopicPartition(topic, number, low if depth is None else max(low, high - depth)))
        tails: dict[tuple[str, int], list[Message]] = {key: [] for key in partitions}
        open_ends = set(partitions)
        reader.assign(starts)
        deadline = time.monotonic() + timeout
        while open_ends:
            if time.monotonic() > deadline:
                raise BrokerError(f"reading {sorted(open_ends)} to their ends took over {timeout:.0f}s")
            for message in reader.consume(10000, 1.0):
                key = (message.topic(), message.partition())
                error = message.error()
                if error is None:
                    tails[key].append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    open_ends.discard(key)
        return tails
    finally:
        reader.close()


def _record(message: Message) -> Record:
    key = message.key()
    kind, timestamp = message.timestamp()
    return Record(
        id=key.decode("utf-8", "replace") if key is not None else f"{message.topic()}:{message.partition()}:{message.offset()}",
        value=message.value() or b"",
        timestamp_ms=timestamp if kind != 0 and timestamp > 0 else None,  # 0: TIMESTAMP_NOT_AVAILABLE
        partition=message.partition(),
        offset=message.offset(),
    )


def read_topic(brokers: str, topic: str, timeout: float = TIMEOUT) -> list[tuple[str, bytes]]:
    """Every record of `topic` now, as (key, value), partition by partition (for checks and tests)."""
    admin = AdminClient(client_settings(brokers))
    partitions = [(topic, number) for number in sorted(admin.list_topics(topic, timeout=timeout).topics[topic].partitions)]
    tails = _tails(brokers, partitions, None, timeout)
    return [(message.key().decode(), message.value()) for key in partitions for message in tails[key]]
