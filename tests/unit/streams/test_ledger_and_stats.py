"""The consumer's bookkeeping without a broker: which offset may be committed, and the figures it reports."""

from __future__ import annotations

import pytest

from scripts.streams.broker import Record
from scripts.streams.consumer import Ledger, StreamSettings
from scripts.streams.stats import StreamStats


def record(partition: int, offset: int) -> Record:
    return Record(id=f"{partition}-{offset}", value=b"[]", timestamp_ms=None, partition=partition, offset=offset)


def test_a_partition_commits_only_past_records_done_in_a_row():
    ledger = Ledger()
    ledger.assign(0, 10)
    ledger.assign(1, 0)
    entries = {offset: ledger.read(record(0, offset)) for offset in range(10, 15)}
    other = ledger.read(record(1, 0))
    assert ledger.outstanding == 6
    ledger.done(entries[11])
    ledger.done(entries[12])
    assert ledger.commits() == {}  # 10 is still in flight: nothing past it may be committed
    ledger.done(entries[10])
    assert ledger.commits() == {0: 13}
    assert ledger.commits() == {}  # only moves are reported
    ledger.done(other)
    ledger.done(entries[14])
    assert ledger.commits() == {1: 1}
    ledger.done(entries[13])
    ledger.done(entries[13])  # twice is once
    assert ledger.commits() == {0: 15}
    assert ledger.outstanding == 0


def test_dropping_a_revoked_partition_forgets_its_records():
    ledger = Ledger()
    ledger.assign(3, 0)
    for offset in range(4):
        ledger.read(record(3, offset))
    ledger.drop(3)
    assert ledger.outstanding == 0
    assert ledger.commits() == {}


def test_latency_quantiles_and_prometheus_text():
    stats = StreamStats()
    for seconds in [0.004] * 98 + [0.2, 7.0]:
        stats.observe_latency(timestamp_ms=1_000, now_ms=1_000 + seconds * 1000)
    stats.observe_latency(timestamp_ms=None, now_ms=5_000)  # no timestamp: not counted
    stats.results, stats.dead_letters, stats.lag = 99, 1, 12
    assert stats.latency_quantile(0.5) == 0.005
    assert stats.latency_quantile(0.99) == 0.25
    assert stats.latency_quantile(1.0) == 10.0
    text = stats.prometheus({"topic": "t", "lane": "digits"})
    assert 'stream_records_total{lane="digits",topic="t",outcome="result"} 99' in text
    assert 'stream_records_total{lane="digits",topic="t",outcome="dead_letter"} 1' in text
    assert 'stream_lag_records{lane="digits",topic="t"} 12' in text
    assert 'stream_latency_seconds_bucket{lane="digits",topic="t",le="0.005"} 98' in text
    assert 'stream_latency_seconds_bucket{lane="digits",topic="t",le="+Inf"} 100' in text
    assert 'stream_latency_seconds_count{lane="digits",topic="t"} 100' in text


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"batch_records": 0}, "--batch-records must be at least 1, got 0"),
        ({"concurrency": -1}, "--concurrency must be at least 1, got -1"),
        ({"batch_records": 64, "max_in_flight": 32}, "--max-in-flight (32) must be at least --batch-records (64)"),
    ],
)
def test_settings_are_checked_with_a_message_that_says_the_fix(settings, message):
    with pytest.raises(ValueError) as raised:
        StreamSettings(**settings).check()
    assert str(raised.value) == message
