"""Consume a topic through a model: one result per record id on the output topic, failures as dead letters.

    python -m scripts.streams.consume --model digits --brokers 127.0.0.1:19092 --input-topic digits.requests
    python -m scripts.streams.consume ... --in-process            # the archive's core here, no server
    python -m scripts.streams.consume ... --idle-exit 10          # stop once nothing came for 10 s

Each record's key is its id, its value the item as JSON (what one entry of `instances` holds: 64 numbers, an
8x8 list, {"b64": ...}, a string for minilm). Results go to --output-topic as {"id", "prediction"} keyed by the
id; records the model rejects (or that are not JSON) go to --dead-letter-topic as {"id", "error", "value", ...}.
Offsets are committed once outcomes are acknowledged: a restarted consumer re-reads what was not committed and
skips ids already answered. SIGTERM or Ctrl-C finishes the records in flight, commits, and exits 0.
Exit status 2: the consumer stopped (broker unreachable, lane refused the token or does not exist).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from scripts import cli
from scripts.archive.core import load_core
from scripts.errors import ScriptError
from scripts.jobs.chunks import RetryPolicy
from scripts.jobs.runners import InProcessRunner, ServerRunner
from scripts.layout import MODEL_STORE
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints
from scripts.streams.consumer import StreamConsumer, StreamSettings
from scripts.streams.kafka import KafkaBroker, ensure_topics
from scripts.streams.stats import StreamStats

EXIT_OK, EXIT_STOPPED = 0, 2


@dataclass(frozen=True)
class ConsumeConfig:
    model: str
    brokers: str
    input_topic: str
    output_topic: str
    dead_letter_topic: str
    group: str
    lane: str
    in_process: bool
    archive: Path
    partitions: int
    settings: StreamSettings
    config: Path
    key_file: Path
    metrics_file: Path | None


def consume(config: ConsumeConfig, stop: threading.Event) -> StreamStats:
    ensure_topics(config.brokers, config.input_topic, [config.output_topic, config.dead_letter_topic], config.partitions)
    stats = StreamStats()
    settings = config.settings
    retry = RetryPolicy(patience=settings.retry.patience, notify=lambda line: _retried(stats, line))
    send = _sender(config)
    if config.in_process:  # torch uses every core for one request already
        settings = StreamSettings(**{**settings.__dict__, "concurrency": 1, "retry": retry})
    else:
        settings = StreamSettings(**{**settings.__dict__, "retry": retry})
    broker = KafkaBroker(
        config.brokers,
        config.group,
        config.input_topic,
        config.output_topic,
        config.dead_letter_topic,
        # Outcomes written past the commit are at most the records in flight; twice that covers their order.
        scan_depth=2 * settings.max_in_flight,
    )
    labels = {"topic": config.input_topic, "group": config.group, "lane": "in-process" if config.in_process else config.lane}

    def report(current: StreamStats) -> None:
        print(json.dumps({"stream": labels, **current.summary()}), file=sys.stderr, flush=True)
        if config.metrics_file is not None:
            current.write_prometheus(config.metrics_file, labels)

    try:
        return StreamConsumer(broker, send, settings, stats, report).run(stop)
    finally:
        broker.close()


def _sender(config: ConsumeConfig):
    if config.in_process:
        return InProcessRunner(load_core(config.archive), config.archive).send
    endpoints = Endpoints.from_config(config.config, config.key_file)
    server = ServerConfig.read(config.config)
    return ServerRunner.for_lane(endpoints, server, config.lane).send


def _retried(stats: StreamStats, line: str) -> None:
    stats.retried()
    print(f"retrying {line}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> ConsumeConfig:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--model", required=True, help="model name: digits, minilm, ...")
    parser.add_argument("--brokers", required=True, help="Kafka bootstrap servers, host:port[,host:port]")
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", help="default <input-topic>.results")
    parser.add_argument("--dead-letter-topic", help="default <input-topic>.dead-letters")
    parser.add_argument("--group", help="consumer group (default <model>-stream)")
    parser.add_argument("--lane", help="server lane (default <model>, the stream lane)")
    parser.add_argument("--in-process", action="store_true", help="no server: run the handler core here")
    parser.add_argument("--archive", type=Path, help="with --in-process: the .mar (default model_store/<model>.mar)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of topics created here (default %(default)s)")
    parser.add_argument("--batch-records", type=int, default=StreamSettings.batch_records, help="records per request")
    parser.add_argument("--concurrency", type=int, default=StreamSettings.concurrency, help="requests in flight")
    parser.add_argument("--max-in-flight", type=int, default=StreamSettings.max_in_flight, help="records read, not committed")
    parser.add_argument("--idle-exit", type=float, metavar="SECONDS", help="stop after this long with nothing to read")
    parser.add_argument("--retry-for", type=float, default=float("inf"), metavar="SECONDS", help="default: forever")
    parser.add_argument("--stats-every", type=float, default=StreamSettings.stats_every, metavar="SECONDS")
    parser.add_argument("--metrics-file", type=Path, help="Prometheus text format, rewritten at every stats line")
    cli.add_server_options(parser)
    args = parser.parse_args(argv)
    settings = StreamSettings(
        batch_records=args.batch_records,
        concurrency=args.concurrency,
        max_in_flight=args.max_in_flight,
        idle_exit=args.idle_exit,
        retry=RetryPolicy(patience=args.retry_for),
        stats_every=args.stats_every,
    )
    try:
        settings.check()
    except ValueError as error:
        parser.error(str(error))
    return ConsumeConfig(
        model=args.model,
        brokers=args.brokers,
        input_topic=args.input_topic,
        output_topic=args.output_topic or f"{args.input_topic}.results",
        dead_letter_topic=args.dead_letter_topic or f"{args.input_topic}.dead-letters",
        group=args.group or f"{args.model}-stream",
        lane=args.lane or args.model,
        in_process=args.in_process,
        archive=args.archive or MODEL_STORE / f"{args.model}.mar",
        partitions=args.partitions,
        settings=settings,
        config=args.config,
        key_file=args.key_file,
        metrics_file=args.metrics_file,
    )


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        stats = consume(config, stop)
    except ScriptError as error:  # BrokerError, JobError, a missing key file, ...
        print(f"stream consumer stopped: {error}", file=sys.stderr)
        return EXIT_STOPPED
    print(json.dumps({"final": stats.summary()}), file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    cli.run(lambda: main())
