"""Put a batch-job input (JSONL, CSV, Parquet, a folder of images) on a topic: one record per row, keyed by its id.

    python -m scripts.streams.produce --brokers 127.0.0.1:19092 --topic digits.requests --input rows.jsonl

The value is the row's item as JSON, what the stream consumer sends as one entry of `instances`. Rows that
cannot be read are reported and not sent.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import orjson
from confluent_kafka import Producer

from scripts import cli
from scripts.jobs.inputs import FORMATS, Row, open_input
from scripts.streams.broker import BrokerError
from scripts.streams.kafka import TIMEOUT, client_settings, ensure_topics


def produce(brokers: str, topic: str, records: Iterable[tuple[str, bytes]]) -> int:
    """Send (key, value) records; returns how many the broker acknowledged (all of them, or BrokerError)."""
    failures: list[str] = []
    producer = Producer({**client_settings(brokers), "acks": "all", "linger.ms": 5})

    def delivered(error, message) -> None:
        if error is not None:
            failures.append(error.str())

    sent = 0
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        sent += 1
    left = producer.flush(TIMEOUT)
    if left or failures:
        raise BrokerError(f"{left + len(failures)} of {sent} records not acknowledged by {brokers}: {failures[:3]}")
    return sent


def row_records(rows: Iterable[Row], skipped: list[Row]) -> Iterable[tuple[str, bytes]]:
    for row in rows:
        if row.problem is not None:
            skipped.append(row)
            continue
        yield str(row.id), orjson.dumps(row.instance, option=orjson.OPT_SERIALIZE_NUMPY)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--brokers", required=True, help="Kafka bootstrap servers, host:port[,host:port]")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--input", required=True, type=Path, help=".jsonl, .csv, .parquet or a folder of images")
    parser.add_argument("--input-format", choices=FORMATS)
    parser.add_argument("--partitions", type=int, default=4, help="when the topic is created here (default %(default)s)")
    args = parser.parse_args(argv)
    ensure_topics(args.brokers, args.topic, [], args.partitions)
    skipped: list[Row] = []
    sent = produce(args.brokers, args.topic, row_records(open_input(args.input, args.input_format).rows(), skipped))
    for row in skipped:
        print(f"row {row.index + 1} not sent: {row.problem}", file=sys.stderr)
    print(f"{sent} records on {args.topic} at {args.brokers}", file=sys.stderr)
    return 1 if skipped else 0


if __name__ == "__main__":
    cli.run(lambda: main())
