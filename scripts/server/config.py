"""config.properties, read in one place: addresses, the lanes it loads, each lane's batching, request limits.

The hot-swap registers a new version with exactly a lane's settings from here, so a swapped-in version
batches like the one `make serve` loaded at start-up (docs/architecture.md §4). Tests and benchmarks render a copy
with other ports (`render`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scripts.errors import ConfigError
from scripts.layout import CONFIG, ROOT

BULK_SUFFIX = "-bulk"
REQUIRED_LANE_KEYS = ("batchSize", "maxBatchDelay", "responseTimeout", "minWorkers")
# TorchServe's own defaults when config.properties leaves max_request_size / job_queue_size out.
DEFAULT_MAX_REQUEST_SIZE = 6_553_500
DEFAULT_JOB_QUEUE_SIZE = 100
LOG4J_FLAG = "-Dlog4j.configurationFile"
# Where clients connect when nginx stands before TorchServe (scripts/server/front_door.py).
FRONT_DOOR_LISTENERS = ("inference", "management", "metrics", "grpc_inference", "grpc_management")
FRONT_DOOR_KEY = "front_door_{}_address"


@dataclass(frozen=True)
class LaneSettings:
    """What register needs for one lane: batch_size, max_batch_delay (ms), response_timeout (s), workers."""

    batch_size: int
    max_batch_delay: int
    response_timeout: int
    workers: int


def read_properties(path: Path) -> dict[str, str]:
    """A Java .properties file as a dict (comments, blank lines and backslash continuations handled)."""
    properties: dict[str, str] = {}
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith(("#", "!"))):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        key, _, value = line.partition("=")
        properties[key.strip()] = value.strip()
    return properties


@dataclass(frozen=True)
class ServerConfig:
    """One config.properties file, parsed."""

    path: Path
    properties: dict[str, str]

    @classmethod
    def read(cls, path: Path = CONFIG) -> ServerConfig:
        if not path.is_file():
            raise ConfigError(f"{path} not found: pass the config.properties the server runs with")
        return cls(path, read_properties(path))

    def get(self, key: str, default: str) -> str:
        return self.properties.get(key, default)

    # -- lanes ----------------------------------------------------------------------------------

    def loaded_lanes(self) -> dict[str, str]:
        """{lane: archive file} loaded at start-up (load_models=name=file.mar,...)."""
        entries = (entry.partition("=") for entry in self.get("load_models", "").split(",") if entry)
        return {lane: archive for lane, _, archive in entries}

    def lanes(self) -> list[str]:
        return list(self.loaded_lanes())

    def lanes_of_archive(self, archive: str) -> dict[str, str]:
        """A load_models override: the lanes served from archive file `archive`, and no others."""
        entries = [f"{lane}={name}" for lane, name in self.loaded_lanes().items() if name == archive]
        if not entries:
            raise ConfigError(
                f"{self.path} loads no lane from {archive}: add it to load_models (load_models=<lane>={archive},...)"
            )
        return {"load_models": ",".join(entries)}

    def lane_settings(self, model: str) -> dict[str, LaneSettings]:
        """{lane name: settings} for `model`'s lanes (`model` and `model-bulk`) declared in models=..."""
        models = self._models_json()
        lanes = [name for name in (model, model + BULK_SUFFIX) if name in models]
        if not lanes:
            known = ", ".join(sorted(models)) or "none"
            raise ConfigError(f"{self.path} declares no lanes for model {model!r} in models=...; declared: {known}")
        return {lane: self._lane(lane, models[lane]) for lane in lanes}

    def _models_json(self) -> dict:
        text = self.properties.get("models")
        if not text:
            raise ConfigError(f"{self.path} has no models= entry: it must give each lane's batching (see docs/architecture.md)")
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{self.path}: models= is not valid JSON ({error})") from None

    def _lane(self, lane: str, versions: dict) -> LaneSettings:
        # Batching belongs to the lane, not to a version: every version entry of a lane carries the same.
        entry = next(iter(versions.values()), {})
        missing = [key for key in REQUIRED_LANE_KEYS if key not in entry]
        if missing:
            raise ConfigError(
                f"{self.path}: lane {lane!r} in models= lacks {', '.join(missing)}"
                f"; each lane needs {', '.join(REQUIRED_LANE_KEYS)}"
            )
        return LaneSettings(
            batch_size=int(entry["batchSize"]),
            max_batch_delay=int(entry["maxBatchDelay"]),
            response_timeout=int(entry["responseTimeout"]),
            workers=int(entry["minWorkers"]),
        )

    # -- limits and files -----------------------------------------------------------------------

    @property
    def max_request_size(self) -> int:
        return int(self.get("max_request_size", str(DEFAULT_MAX_REQUEST_SIZE)))

    @property
    def job_queue_size(self) -> int:
        """Requests each lane queues before TorchServe answers 503 (per model version)."""
        return int(self.get("job_queue_size", str(DEFAULT_JOB_QUEUE_SIZE)))

    @property
    def model_store(self) -> Path:
        """model_store=, relative to the repository root (where `make serve` starts TorchServe)."""
        store = Path(self.get("model_store", "model_store"))
        return store if store.is_absolute() else ROOT / store

    @property
    def metrics_config(self) -> Path | None:
        """metrics_config= (the metrics YAML), relative to the repository root; None: TorchServe's default."""
        value = self.properties.get("metrics_config")
        if not value:
            return None
        path = Path(value)
        return path if path.is_absolute() else ROOT / path

    @property
    def vmargs(self) -> str:
        """vmargs= (the JVM's flags) with the log4j2 config's path made absolute: TorchServe's JVM resolves a
        relative -Dlog4j.configurationFile= from the folder it starts in, which is a copy's, not the repository."""
        return self.vmargs_with_log_config(lambda value: value if Path(value).is_absolute() else str(ROOT / value))

    def vmargs_with_log_config(self, place: Callable[[str], str]) -> str:
        """vmargs= with the -Dlog4j.configurationFile= path as `place` maps it (the cluster's configs mount it elsewhere)."""
        words = []
        for word in self.properties.get("vmargs", "").split():
            key, sep, value = word.partition("=")
            words.append(f"{LOG4J_FLAG}={place(value)}" if key == LOG4J_FLAG and sep else word)
        return " ".join(words)

    def render(self, out: Path, model_store: Path, ports: dict[str, int], overrides: dict[str, str] | None = None) -> Path:
        """A copy of this file with other ports, model store and any overrides, for a second server."""
        # Paths TorchServe resolves from the folder it starts in, which is the copy's, not the repository.
        files = {"metrics_config": str(self.metrics_config)} if self.metrics_config is not None else {}
        if self.vmargs:
            files["vmargs"] = self.vmargs
        addresses = {
            **files,
            "inference_address": f"http://127.0.0.1:{ports['inference']}",
            "management_address": f"http://127.0.0.1:{ports['management']}",
            "metrics_address": f"http://127.0.0.1:{ports['metrics']}",
            "grpc_inference_port": str(ports["grpc_inference"]),
            "grpc_management_port": str(ports["grpc_management"]),
            "model_store": str(model_store),
            # Backend workers listen on initial_worker_port + n: move them off `make serve`'s 9000.
            "initial_worker_port": str(ports["workers"]),
        }
        # The front door's listeners: on the ports given for them (front_door_inference, ...), else none: a server
        # for tests is reached directly unless it asks for one (scripts/server/temporary.py).
        for name in FRONT_DOOR_LISTENERS:
            if f"front_door_{name}" in ports:
                addresses[FRONT_DOOR_KEY.format(name)] = f"127.0.0.1:{ports['front_door_' + name]}"
        replaced = {**addresses, **(overrides or {})}
        lines, seen = [], set()
        for line in self.path.read_text().splitlines():
            key = line.partition("=")[0].strip()
            if key.startswith("front_door_") and key not in replaced:
                continue
            if "=" in line and not line.lstrip().startswith("#") and key in replaced:
                lines.append(f"{key}={replaced[key]}")
                seen.add(key)
            else:
                lines.append(line)
        lines += [f"{key}={value}" for key, value in replaced.items() if key not in seen]
        out.write_text("\n".join(lines) + "\n")
        return out
