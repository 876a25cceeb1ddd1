"""Per-lane batching and workers, read from config.properties' models= JSON (the one source of truth).

The hot-swap registers a new version with exactly these settings, so a swapped-in version batches
like the one `make serve` loaded at start-up (DESIGN.md §4).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scripts.endpoints import read_properties

BULK_SUFFIX = "-bulk"
REQUIRED = ("batchSize", "maxBatchDelay", "responseTimeout", "minWorkers")


@dataclass(frozen=True)
class LaneSettings:
    """What register needs for one lane: batch_size, max_batch_delay (ms), response_timeout (s), workers."""

    batch_size: int
    max_batch_delay: int
    response_timeout: int
    workers: int


def lane_settings(config: Path, model: str) -> dict[str, LaneSettings]:
    """{lane name: settings} for `model`'s lanes (`model` and `model-bulk`) that config.properties declares."""
    models = _models_json(config)
    lanes = [name for name in (model, model + BULK_SUFFIX) if name in models]
    if not lanes:
        known = ", ".join(sorted(models)) or "none"
        raise SystemExit(f"{config} declares no lanes for model {model!r} in models=...; declared: {known}")
    return {lane: _settings(config, lane, models[lane]) for lane in lanes}


def _models_json(config: Path) -> dict:
    text = read_properties(config).get("models")
    if not text:
        raise SystemExit(f"{config} has no models= entry: it must give each lane's batching (see DESIGN.md §4)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise SystemExit(f"{config}: models= is not valid JSON ({error})") from None


def _settings(config: Path, lane: str, versions: dict) -> LaneSettings:
    # Batching belongs to the lane, not to a version: every version entry of a lane carries the same.
    entry = next(iter(versions.values()), {})
    missing = [key for key in REQUIRED if key not in entry]
    if missing:
        raise SystemExit(f"{config}: lane {lane!r} in models= lacks {', '.join(missing)}; each lane needs {', '.join(REQUIRED)}")
    return LaneSettings(
        batch_size=int(entry["batchSize"]),
        max_batch_delay=int(entry["maxBatchDelay"]),
        response_timeout=int(entry["responseTimeout"]),
        workers=int(entry["minWorkers"]),
    )
