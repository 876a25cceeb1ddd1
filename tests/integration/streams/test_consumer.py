"""The stream consumer against a real broker (Tansu) and a real TorchServe: records through the stream lane and
in process, poison records to the dead-letter topic, the consumer SIGKILLed and restarted, the lane's queue full,
and TorchServe restarted under it. Every check reads the output topics back: one result per id, none lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scripts.jobs.chunks import RetryPolicy
from scripts.layout import MODEL_STORE, ROOT
from scripts.server.temporary import only_lanes_of
from scripts.streams.consume import ConsumeConfig, consume
from scripts.streams.consumer import StreamSettings
from scripts.streams.stats import StreamStats
from tests.integration.conftest import start_server
from tests.integration.streams.conftest import Topics, check_exactly_once, put_digits

DIGITS_IN_MAKE_TEST = 5_000
DIGITS_SLOW = 100_000


def config(topics: Topics, server=None, metrics: Path | None = None, **settings) -> ConsumeConfig:
    """The consumer of `topics` through `server`'s stream lane (in process when None), stopping once idle 3 s."""
    return ConsumeConfig(
        model="digits",
        brokers=topics.brokers,
        input_topic=topics.input,
        output_topic=topics.output,
        dead_letter_topic=topics.dead_letters,
        group=topics.group,
        lane="digits",
        in_process=server is None,
        archive=MODEL_STORE / "digits.mar",
        partitions=4,
        settings=StreamSettings(**{"idle_exit": 3.0, "stats_every": 2.0, **settings}),
        config=server.server.config if server else ROOT / "config.properties",
        key_file=server.endpoints.key_file if server else ROOT / "key_file.json",
        metrics_file=metrics,
    )


def report(name: str, stats: StreamStats, **figures) -> None:
    print(f"\n{name}: {json.dumps({**stats.summary(), **figures})}")


def test_records_through_the_stream_lane(digits_server, topics, tmp_path):
    labels = put_digits(topics, DIGITS_IN_MAKE_TEST)
    metrics = tmp_path / "stream.prom"
    started = time.monotonic()
    stats = consume(config(topics, digits_server, metrics), threading.Event())
    seconds = time.monotonic() - started
    figures = check_exactly_once(topics, labels)
    assert (stats.results, stats.dead_letters, stats.duplicates_skipped, stats.lag) == (len(labels), 3, 0, 0)
    assert stats.records_in == len(labels) + 3
    text, tag = metrics.read_text(), f'group="{topics.group}",lane="digits",topic="{topics.input}"'
    assert f'stream_records_total{{{tag},outcome="result"}} {len(labels)}' in text
    assert f'stream_records_total{{{tag},outcome="dead_letter"}} 3' in text
    assert f"stream_latency_seconds_count{{{tag}}} {len(labels) + 3}" in text
    report("stream lane", stats, **figures, seconds_with_3s_idle=round(seconds, 1))


def test_records_through_the_core_in_process(topics):
    labels = put_digits(topics, DIGITS_IN_MAKE_TEST)
    stats = consume(config(topics, batch_records=256), threading.Event())
    figures = check_exactly_once(topics, labels)
    assert (stats.results, stats.dead_letters) == (len(labels), 3)
    report("in process", stats, **figures)


@pytest.mark.slow
@pytest.mark.parametrize("lane", ["stream", "in-process"])
def test_100k_records(digits_server, topics, lane):
    labels = put_digits(topics, DIGITS_SLOW)
    server = digits_server if lane == "stream" else None
    stats = consume(config(topics, server, batch_records=256, max_in_flight=4096), threading.Event())
    figures = check_exactly_once(topics, labels)
    assert (stats.results, stats.dead_letters) == (DIGITS_SLOW, 3)
    report(f"100k records, {lane}", stats, **figures)


def consumer_process(topics: Topics, server, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "scripts.streams.consume", "--model", "digits", "--brokers", topics.brokers]
    command += ["--input-topic", topics.input, "--output-topic", topics.output, "--dead-letter-topic", topics.dead_letters]
    command += ["--group", topics.group, "--idle-exit", "5", "--stats-every", "1", "--max-in-flight", "1024"]
    command += ["--config", str(server.server.config), "--key-file", str(server.endpoints.key_file)]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("ab"))


def stats_lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


# The consumer's restarts take a minute and a half of make test: they run in `make test-slow` (.ci/run), beside the
# 100k-record runs; the records through both runners, above, stay in make test.
@pytest.mark.slow
def test_consumer_sigkilled_mid_stream_and_restarted(digits_server, topics, tmp_path):
    labels = put_digits(topics, 10_000)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = consumer_process(topics, digits_server, first_log)
    try:
        deadline = time.monotonic() + 180
        while not any(line.get("results", 0) >= 3_000 for line in stats_lines(first_log)):
            assert first.poll() is None and time.monotonic() < deadline, first_log.read_text()[-2000:]
            time.sleep(0.1)
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.kill()
        first.wait()
    answered_before_kill = len(topics.results())
    assert 0 < answered_before_kill < len(labels)
    second = consumer_process(topics, digits_server, second_log)
    assert second.wait(timeout=300) == 0, second_log.read_text()[-2000:]
    final = json.loads(second_log.read_text().splitlines()[-1])["final"]
    figures = check_exactly_once(topics, labels)
    # The second run answered what the first had not: the results it wrote plus those it found already written.
    assert final["results"] + answered_before_kill == len(labels)
    print(
        "\nSIGKILL and restart:",
        json.dumps(dict(records_in=len(labels) + 3, results_before_kill=answered_before_kill, second_run=final, **figures)),
    )


@pytest.fixture(scope="module")
def restartable_server(tmp_path_factory):
    """digits' lanes of their own, with a queue of 2 requests per lane, so a busy consumer meets 503s."""
    overrides = {**only_lanes_of("digits.mar"), "job_queue_size": "2"}
    yield from start_server(tmp_path_factory.mktemp("torchserve-streams"), ["digits.mar"], overrides)


@pytest.mark.slow
def test_queue_full_slows_the_consumer(restartable_server, topics, capsys):
    labels = put_digits(topics, 2_000, poison=False)
    stats = consume(config(topics, restartable_server, batch_records=4, concurrency=16), threading.Event())
    told = [line for line in capsys.readouterr().err.splitlines() if line.startswith("retrying ")]
    figures = check_exactly_once(topics, labels, poison=False)
    assert stats.retries > 0 and any("HTTP 503" in line for line in told), told[:3]
    report("queue full", stats, **figures)


@pytest.mark.slow
def test_torchserve_restarted_under_the_consumer(restartable_server, topics, capsys):
    """TorchServe stops while the consumer runs, and records arrive while it is down: they wait (retried, never
    dead-lettered) until it is back. The rest of the records are produced only once the server has stopped, so the
    consumer cannot have finished before (it did once: 5,000 records in 2.2 s)."""
    first = slice(0, 1_000)
    labels = put_digits(topics, 5_000, part=first)
    stop = threading.Event()
    settings = {"batch_records": 32, "concurrency": 2, "idle_exit": 10.0}
    settings["retry"] = RetryPolicy(patience=float("inf"), max_delay=2.0)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(consume, config(topics, restartable_server, **settings), stop)
        deadline = time.monotonic() + 120
        while len(topics.results()) < 500:
            assert not running.done() and time.monotonic() < deadline
            time.sleep(0.2)
        stopped = time.monotonic()
        restartable_server.server.restart(
            ["digits", "digits-bulk"], while_stopped=lambda: put_digits(topics, 5_000, part=slice(first.stop, None))
        )
        restarted = time.monotonic() - stopped
        stats = running.result(timeout=600)
    told = [line for line in capsys.readouterr().err.splitlines() if line.startswith("retrying ")]
    figures = check_exactly_once(topics, labels)
    assert stats.retries > 0 and told
    report("TorchServe restarted", stats, **figures, lanes_ready_after_s=round(restarted, 1))
