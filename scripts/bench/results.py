"""One model's benchmark results: what the stream benchmark measures and the plots and the report read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scripts.bench.pipeline import cpu_limit
from scripts.server.config import LaneSettings


@dataclass
class ModelBench:
    """One model's figures from `make bench`: its lane, the pipeline's and the no-op floor's CPU cost per
    request, and every load run by system (closed loop: connections; open loop: offered rates)."""

    model: str
    lane: LaneSettings
    cores: int
    closed: dict[str, list[dict]] = field(default_factory=dict)  # system -> LoadResult dicts
    open: dict[str, list[dict]] = field(default_factory=dict)
    pipeline_cpu_ms: float = 0.0
    pipeline_rps_one_thread: float = 0.0
    floor_cpu_ms: float = 0.0
    lone: dict[str, dict] = field(default_factory=dict)  # system -> attribution.LoneRequest rows, one connection
    log_bytes: dict[str, float] = field(default_factory=dict)  # bytes written to logs per request, by setting
    peer_settings: dict[str, dict] = field(default_factory=dict)  # peer -> the settings it ran with
    server_cpu_ms: dict[str, float] = field(default_factory=dict)  # system -> its server's CPU per request, top load
    failed: dict[str, str] = field(default_factory=dict)  # peer -> why it has no figures (did not start, wrong answer)
    image_stages: dict[str, float] = field(default_factory=dict)  # image tasks: ms per image by stage, in process
    plan: Any = None  # scripts.bench.stream.Plan this model ran (its cost can lengthen the points)

    @property
    def ceiling(self) -> float:
        """Requests/s if every core ran only the in-process pipeline."""
        return self.cores * 1000.0 / self.pipeline_cpu_ms

    @property
    def cpu_limit(self) -> float:
        return cpu_limit(self.cores, self.floor_cpu_ms, self.pipeline_cpu_ms)

    def at(self, system: str, connections: int) -> dict:
        return next(r for r in self.closed[system] if r["connections"] == connections)

    def run(self, system: str, connections: int) -> dict | None:
        """The closed-loop run of `system` at `connections`; None if that system has none (it failed to start)."""
        return next((r for r in self.closed.get(system, []) if r["connections"] == connections), None)

    def connections(self) -> list[int]:
        """The closed loop's connection counts, as the first system ran them (every system runs the same)."""
        return [run["connections"] for run in next(iter(self.closed.values()), [])]
