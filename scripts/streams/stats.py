"""The stream consumer's figures: records in and out, dead letters, skipped duplicates, retries, lag, latency.

Latency is end to end: from the record's timestamp (set by its producer, or the broker) to the moment its
outcome was acknowledged by the broker. `prometheus()` renders them in Prometheus' text format (written to
--metrics-file for node_exporter's textfile collector), `summary()` as one JSON-able dict (stderr lines).
"""

from __future__ import annotations

import bisect
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

# Seconds; wide enough for a lane that waits out a TorchServe restart (minutes).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class StreamStats:
    # Records/s counts from the first record read to the last outcome written: joining the group (seconds) and
    # waiting for records that do not come are not throughput.
    first_record_at: float | None = None
    last_outcome_at: float | None = None
    records_in: int = 0
    results: int = 0
    dead_letters: int = 0
    duplicates_skipped: int = 0
    retries: int = 0
    lag: int = 0
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe_latency(self, timestamp_ms: int | None, now_ms: float) -> None:
        if timestamp_ms is None:
            return
        seconds = max(0.0, (now_ms - timestamp_ms) / 1000)
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    def retried(self) -> None:
        with self._lock:  # told from the request threads
            self.retries += 1

    @property
    def answered(self) -> int:
        return self.results + self.dead_letters

    def records_per_second(self) -> float:
        if self.first_record_at is None or self.last_outcome_at is None:
            return 0.0
        elapsed = self.last_outcome_at - self.first_record_at
        return self.answered / elapsed if elapsed > 0 else 0.0

    def latency_quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding quantile q (as Prometheus' histogram_quantile would bound it)."""
        total = sum(self.latency_counts)
        if total == 0:
            return None
        rank, seen = q * total, 0
        for index, count in enumerate(self.latency_counts):
            seen += count
            if seen >= rank:
                return LATENCY_BUCKETS[index] if index < len(LATENCY_BUCKETS) else float("inf")
        return float("inf")

    def summary(self) -> dict:
        return {
            "records_in": self.records_in,
            "results": self.results,
            "dead_letters": self.dead_letters,
            "duplicates_skipped": self.duplicates_skipped,
            "retries": self.retries,
            "lag": self.lag,
            "records_per_s": round(self.records_per_second(), 1),
            "latency_p50_le_s": self.latency_quantile(0.5),
            "latency_p99_le_s": self.latency_quantile(0.99),
        }

    def prometheus(self, labels: dict[str, str]) -> str:
        tag = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
        lines = [
            "# HELP stream_records_total Records taken from the input topic, by what became of them.",
            "# TYPE stream_records_total counter",
            f'stream_records_total{{{tag},outcome="result"}} {self.results}',
            f'stream_records_total{{{tag},outcome="dead_letter"}} {self.dead_letters}',
            f'stream_records_total{{{tag},outcome="duplicate_skipped"}} {self.duplicates_skipped}',
            "# HELP stream_retries_total Requests to the lane retried (no answer, 5xx, 503 queue full).",
            "# TYPE stream_retries_total counter",
            f"stream_retries_total{{{tag}}} {self.retries}",
            "# HELP stream_lag_records Records in the assigned partitions not committed yet.",
            "# TYPE stream_lag_records gauge",
            f"stream_lag_records{{{tag}}} {self.lag}",
            "# HELP stream_latency_seconds From the record's timestamp to its outcome acknowledged by the broker.",
            "# TYPE stream_latency_seconds histogram",
        ]
        cumulative = 0
        for bound, count in zip([*LATENCY_BUCKETS, "+Inf"], self.latency_counts, strict=True):
            cumulative += count
            lines.append(f'stream_latency_seconds_bucket{{{tag},le="{bound}"}} {cumulative}')
        lines.append(f"stream_latency_seconds_sum{{{tag}}} {self.latency_sum:.6f}")
        lines.append(f"stream_latency_seconds_count{{{tag}}} {cumulative}")
        return "\n".join(lines) + "\n"

    def write_prometheus(self, path: Path, labels: dict[str, str]) -> None:
        staged = path.with_name(path.name + ".tmp")
        staged.write_text(self.prometheus(labels))
        os.replace(staged, path)  # a scraper never reads half a file
