"""The models this project serves, each described once by its own folder (docs/models.md).

    python -m models.registry names          # the models found, one per line (the Makefile's list)
    python -m models.registry sources NAME   # the files an archive of NAME is built from (the Makefile's rules)
    python -m models.registry check          # every folder's declarations, checked against each other
    python -m models.registry properties     # config.properties' load_models= and models= as the folders declare
    python -m models.registry properties --write FILE...   # rewrite them in place (make archive does)
    python -m models.registry alerts --write monitoring/alerts.yml   # the stream lanes' p99 objectives (make archive)

A model is a folder models/<name>/ holding:
  - model.yaml: its lanes (a stream lane named <name>, a bulk lane <name>-bulk) with TorchServe's batching and
    workers for each, and each lane's worst measured worker peak (the pod's memory is summed from it); and, for
    `make bench`, optionally the sample its stream bench sends and the candidate settings each peer runs (bench:);
  - model-config.yaml: the archive's own config (the handler's task and limits, per-lane maps keyed by lane name);
  - archive.py: `artifacts(version, build_dir, fmt, precision)`, the serving files built for the archive;
  - portable.py: `PORTABLE`, the model rebuilt from plain weights where only torch is, and how its answers on a GPU
    must match the CPU's (models/portable.py; the GPU check and the device calls, scripts/gpu/);
  - samples.json: sample requests with the answers they must get, and how an answer is compared
    (samples.py writes it from the model's reference). The warm-up, the swap gate and probe, the image's health
    check, `make archive`'s own check, the tests and the bench all send these.
Everything else (the Makefile, config.properties, the front door, the pod, the warm-up, hot-swap, the bench and the
hardening tools) finds the models here; no script names one. This module reads YAML and JSON only, so the serving
image (no tools layer) can use it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODEL_FILE = "model.yaml"
SAMPLES_FILE = "samples.json"
BULK_SUFFIX = "-bulk"
DEFAULT_LANE = "default"
STREAM, BULK = "stream", "bulk"
LANE_KEYS = {"workers", "batch_size", "max_batch_delay_ms", "response_timeout_s", "worker_peak_mib"}
# Stream lanes also: the p99 objective of the handler's time per batch (seconds), which monitoring/alerts.yml alerts on.
STREAM_KEYS = {"p99_objective_s"}
MATCHERS = ("equal", "close", "cosine")
# model.yaml's optional bench: what `make bench` runs for this model (scripts/bench/): peers, the settings each peer
# of the field runs with ({peer key: index into its candidates}, the best of the last `make bench-sweep`; a peer
# not named runs its first candidate); request, the index of the sample the stream bench sends as its one-row body
# (default 0); stream_goals and field_goals, the targets its figures are checked against (ratios lane / other in one
# run, ms and B upper bounds; a goal not named is not checked for this model); job, what sizes the batch jobs the
# benches run: rows_per_s, the model's bulk job alone on this 2-core machine (docs/benchmarks.md), and chunk_size,
# the rows of each request a job sends its bulk lane (scripts/bench/beside.py).
BENCH_KEYS = {"peers", "request", "stream_goals", "field_goals", "job"}
JOB_DEFAULTS = {"rows_per_s": 100, "chunk_size": 32}
GOALS = {
    "stream_goals": {
        "p50_over_flask_ms", "p50_over_floor_ms", "rate_over_flask_mid", "share_of_cpu_limit_top", "rate_over_flask_top",
        "rate_over_batch1_top", "p99_top_ms", "share_of_pipeline_top", "log_bytes_per_request",
    },
    "field_goals": {"rate_over_best_peer_top", "p99_over_best_peer_top", "p50_over_best_peer_ms"},
}  # fmt: skip
# model.yaml's optional soak: how `make soak` loads the model (scripts/hardening/soak.py): connections, those wrk keeps
# busy on its stream lane (a slow model fewer, so the machine is not saturated by one model); job_rows, the rows of
# each batch job through its bulk lane (cycled from samples.json; a few seconds' work).
SOAK_DEFAULTS = {"connections": 2, "job_rows": 64}
NAME = re.compile(r"[a-z][a-z0-9_]*")


class RegistryError(Exception):
    """A model folder that contradicts itself; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class Lane:
    """One TorchServe model name serving a model: its own queue, workers and batching."""

    name: str
    model: str
    role: str  # stream | bulk
    workers: int
    batch_size: int
    max_batch_delay_ms: int
    response_timeout_s: int
    worker_peak_mib: int
    p99_objective_s: float | None = None

    @property
    def bulk(self) -> bool:
        return self.role == BULK

    def torchserve_entry(self, version: str = "1.0") -> dict[str, Any]:
        """This lane's entry in config.properties' models= (TorchServe's own key names)."""
        return {
            version: {
                "marName": f"{self.model}.mar",
                "minWorkers": self.workers,
                "maxWorkers": self.workers,
                "batchSize": self.batch_size,
                "maxBatchDelay": self.max_batch_delay_ms,
                "responseTimeout": self.response_timeout_s,
            }
        }


@dataclass(frozen=True)
class Samples:
    """Requests with the answers they must get, and how a served answer is compared with one.

    match: {"equal": [path, ...]} (the values at each path are equal), {"close": {path: tolerance}} (numbers, or
    lists of numbers, within the tolerance), {"cosine": {path: least}} (vectors at least that similar). A path is
    keys joined by dots; `*` maps over a list ("top5.*.index"). min_agreement: the share of samples that must agree
    (below 1 where the answers are the data's true labels, not the model's own).
    """

    model: str
    instances: tuple[Any, ...]
    answers: tuple[Any, ...]
    match: Mapping[str, Any]
    min_agreement: float

    def problem(self, prediction: Any, answer: Any) -> str | None:
        """None when `prediction` agrees with `answer`; otherwise what differs, named by its path."""
        for kind, spec in self.match.items():
            for path, bound in spec.items() if isinstance(spec, Mapping) else ((p, None) for p in spec):
                try:
                    served, expected = pick(prediction, path), pick(answer, path)
                except (KeyError, IndexError, TypeError):
                    return f"no {path} in {str(prediction)[:120]}"
                if kind == "equal" and served != expected:
                    return f"{path} is {str(served)[:80]}, expected {str(expected)[:80]}"
                if kind == "close" and not _close(served, expected, bound):
                    return f"{path} is {str(served)[:80]}, expected {str(expected)[:80]} within {bound}"
                if kind == "cosine":
                    similarity = _cosine(served, expected)
                    if not similarity >= bound:
                        return f"{path} has cosine {similarity:.4f} to the expected one, needs {bound}"
        return None

    def request(self, rows: int = 1) -> list[Any]:
        """`rows` instances, cycling through the samples (a bulk lane's chunk)."""
        return [self.instances[i % len(self.instances)] for i in range(rows)]


@dataclass(frozen=True)
class Model:
    name: str
    folder: Path
    lanes: tuple[Lane, ...]
    bench: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    soak: Mapping[str, int] = dataclasses.field(default_factory=lambda: dict(SOAK_DEFAULTS))

    @property
    def stream_lane(self) -> Lane:
        return next(lane for lane in self.lanes if not lane.bulk)

    @property
    def bulk_lane(self) -> Lane | None:
        return next((lane for lane in self.lanes if lane.bulk), None)

    @property
    def lane_names(self) -> list[str]:
        return [lane.name for lane in self.lanes]

    def handler_config(self) -> dict[str, Any]:
        return _yaml(self.folder / "model-config.yaml")

    @property
    def task(self) -> str:
        """The name of the handler's task (handlers/tasks/, TASKS), from model-config.yaml's handler.task."""
        return self.handler_config()["handler"]["task"]

    def handler_value(self, key: str, lane: str, default: Any = None) -> Any:
        """model-config.yaml's handler.<key> for `lane`, a per-lane map resolved as the handler does."""
        return per_lane(self.handler_config()["handler"].get(key, default), lane)

    def samples(self) -> Samples:
        return _samples(self.name, self.folder / SAMPLES_FILE)

    def sources(self) -> list[Path]:
        """The folder's files an archive is built from (what `make archive` watches)."""
        return sorted(p for p in self.folder.iterdir() if p.is_file() and p.suffix in {".py", ".yaml", ".json"})


def per_lane(value: Any, lane: str | None) -> Any:
    """A handler value set once or per lane ({lane: value, default: value})."""
    if not isinstance(value, Mapping):
        return value
    if lane is not None and lane in value:
        return value[lane]
    return value.get(DEFAULT_LANE)


def pick(value: Any, path: str) -> Any:
    keys = path.split(".")
    for position, key in enumerate(keys):
        if key == "*":
            rest = ".".join(keys[position + 1 :])
            return [pick(item, rest) if rest else item for item in value]
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def largest_difference(served: Any, expected: Any) -> float:
    """The largest absolute difference between the numbers of two answers of the same shape; inf where their shapes,
    keys or any non-number (a label's name) differ."""
    if isinstance(served, bool) or isinstance(expected, bool):
        return 0.0 if served == expected else math.inf
    if isinstance(served, int | float) and isinstance(expected, int | float):
        return abs(float(served) - float(expected))
    if isinstance(served, Mapping) and isinstance(expected, Mapping):
        if served.keys() != expected.keys():
            return math.inf
        return max((largest_difference(served[key], expected[key]) for key in served), default=0.0)
    if isinstance(served, list | tuple) and isinstance(expected, list | tuple):
        if len(served) != len(expected):
            return math.inf
        return max((largest_difference(a, b) for a, b in zip(served, expected, strict=True)), default=0.0)
    return 0.0 if served == expected else math.inf


def _close(served: Any, expected: Any, tolerance: float) -> bool:
    if isinstance(expected, list):
        if not isinstance(served, list) or len(served) != len(expected):
            return False
        return all(_close(a, b, tolerance) for a, b in zip(served, expected, strict=True))
    return isinstance(served, (int, float)) and math.isfinite(served) and abs(served - expected) <= tolerance


def _cosine(served: Any, expected: Sequence[float]) -> float:
    if not isinstance(served, list) or len(served) != len(expected):
        return float("nan")
    dot = sum(a * b for a, b in zip(served, expected, strict=True))
    norms = math.sqrt(sum(a * a for a in served)) * math.sqrt(sum(b * b for b in expected))
    return dot / norms if norms else float("nan")


# -- discovery ------------------------------------------------------------------------------------------------


def discover(root: Path = HERE) -> dict[str, Model]:
    """{name: model} for every models/<name>/model.yaml, in name order."""
    return {folder.name: _model(folder) for folder in sorted(p.parent for p in root.glob(f"*/{MODEL_FILE}"))}


@functools.lru_cache(maxsize=1)
def models() -> dict[str, Model]:
    return discover()


def model(name: str) -> Model:
    found = models()
    if name not in found:
        raise RegistryError(
            f"unknown model {name!r}; the models are {', '.join(found)} (a model is a folder models/<name>/ with {MODEL_FILE})"
        )
    return found[name]


def lane(name: str) -> tuple[Model, Lane]:
    """The model serving lane `name` and the lane itself."""
    for found in models().values():
        for candidate in found.lanes:
            if candidate.name == name:
                return found, candidate
    known = ", ".join(lane.name for found in models().values() for lane in found.lanes)
    raise RegistryError(f"no model serves lane {name!r}; the lanes are {known}")


def add_model_option(parser, help: str = "a model in models/") -> None:
    """--model on an argparse parser: one of the models found (default: the first, as `make`'s MODEL)."""
    known = sorted(models())
    parser.add_argument("--model", default=known[0], choices=known, help=f"{help} (default %(default)s)")


def lanes() -> list[Lane]:
    return [lane for found in models().values() for lane in found.lanes]


def _model(folder: Path) -> Model:
    declared = _yaml(folder / MODEL_FILE)
    where = folder / MODEL_FILE
    name = folder.name
    if not NAME.fullmatch(name):
        raise RegistryError(
            f"{folder}: a model's name is lower-case letters, digits and _ (its lanes add -bulk, its archives -<version>)"
        )
    unknown = sorted(set(declared) - {"lanes", "bench", "soak"})
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {', '.join(unknown)}; a model.yaml holds lanes: (and bench:, soak:)")
    bench = _bench(declared.get("bench") or {}, where)
    soak = _positive_counts(declared.get("soak") or {}, SOAK_DEFAULTS, "soak:", where)
    lanes_declared = declared.get("lanes") or {}
    if name not in lanes_declared:
        raise RegistryError(f"{where}: no stream lane; declare lanes: {{{name}: {{...}}}} (named after the folder)")
    built = []
    for lane_name, settings in lanes_declared.items():
        if lane_name not in (name, name + BULK_SUFFIX):
            raise RegistryError(f"{where}: lane {lane_name!r} is neither {name} (stream) nor {name}{BULK_SUFFIX} (bulk)")
        settings = dict(settings or {})
        role = BULK if lane_name.endswith(BULK_SUFFIX) else STREAM
        allowed = LANE_KEYS | (STREAM_KEYS if role == STREAM else set())
        needed = allowed if role == STREAM else LANE_KEYS
        missing, extra = sorted(needed - set(settings)), sorted(set(settings) - allowed)
        if missing or extra:
            problem = (f"lacks {', '.join(missing)}" if missing else "") + ("; " if missing and extra else "")
            problem += f"has unknown key(s) {', '.join(extra)}" if extra else ""
            raise RegistryError(f"{where}: lane {lane_name} {problem}; a {role} lane declares {', '.join(sorted(needed))}")
        objective = settings.pop("p99_objective_s", None)
        if objective is not None and not (isinstance(objective, (int, float)) and objective > 0):
            raise RegistryError(
                f"{where}: lanes.{lane_name}.p99_objective_s must be a positive number of seconds, got {objective!r}"
            )
        for key in LANE_KEYS:
            if not isinstance(settings[key], int) or isinstance(settings[key], bool) or settings[key] < 1:
                raise RegistryError(f"{where}: lanes.{lane_name}.{key} must be a positive integer, got {settings[key]!r}")
        built.append(Lane(lane_name, name, role, **settings, p99_objective_s=objective))
    return Model(name, folder, tuple(built), bench, soak)


def _positive_counts(value: Any, defaults: Mapping[str, int], key: str, where: Path) -> dict[str, int]:
    """An optional map of `defaults`' keys to positive integers, completed from `defaults`."""
    if (
        not isinstance(value, Mapping)
        or set(value) - set(defaults)
        or not all(isinstance(count, int) and not isinstance(count, bool) and count > 0 for count in value.values())
    ):
        raise RegistryError(f"{where}: {key} takes {', '.join(defaults)} only, each a positive integer, got {value!r}")
    return {**defaults, **value}


def _bench(bench: Any, where: Path) -> dict[str, Any]:
    if not isinstance(bench, Mapping) or set(bench) - BENCH_KEYS:
        raise RegistryError(f"{where}: bench: takes {', '.join(sorted(BENCH_KEYS))} only, got {bench!r}")
    peers = bench.get("peers") or {}
    if not isinstance(peers, Mapping) or not all(
        isinstance(index, int) and not isinstance(index, bool) and index >= 0 for index in peers.values()
    ):
        raise RegistryError(f"{where}: bench.peers maps a peer's key to an index into its candidates (0, 1, ...), got {peers!r}")
    request = bench.get("request", 0)
    if not isinstance(request, int) or isinstance(request, bool) or request < 0:
        raise RegistryError(f"{where}: bench.request is the index of a sample in samples.json (0, 1, ...), got {request!r}")
    goals = {}
    for key, known in GOALS.items():
        declared = bench.get(key) or {}
        unknown = sorted(set(declared) - known) if isinstance(declared, Mapping) else [repr(declared)]
        if unknown or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in declared.values()):
            raise RegistryError(
                f"{where}: bench.{key} maps goals to numbers; unknown or not a number: {', '.join(unknown) or declared}; "
                f"the goals are {', '.join(sorted(known))}"
            )
        goals[key] = dict(declared)
    job = _positive_counts(bench.get("job") or {}, JOB_DEFAULTS, "bench.job", where)
    return {"peers": dict(peers), "request": request, **goals, "job": job}


@functools.lru_cache(maxsize=16)
def _samples(name: str, path: Path) -> Samples:
    if not path.exists():
        raise RegistryError(
            f"{path} is missing: every model has sample requests with their answers (python -m models.{name}.samples writes it)"
        )
    data = json.loads(path.read_text())
    samples = data.get("samples") or []
    if not samples or any(set(sample) != {"instance", "answer"} for sample in samples):
        raise RegistryError(f'{path}: "samples" must be a non-empty list of {{"instance": ..., "answer": ...}}')
    match = data.get("match") or {}
    if not match or set(match) - set(MATCHERS):
        raise RegistryError(f'{path}: "match" must name one or more of {", ".join(MATCHERS)}, got {sorted(match)}')
    agreement = data.get("min_agreement", 1.0)
    return Samples(
        name,
        tuple(sample["instance"] for sample in samples),
        tuple(sample["answer"] for sample in samples),
        match,
        float(agreement),
    )


def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text()) or {}


# -- checks and generated values --------------------------------------------------------------------------------


def check(found: Model) -> list[str]:
    """What contradicts itself in a model's folder: per-lane keys for lanes it does not declare, samples that are
    missing or unreadable, a sample whose own answer disagrees with the comparison (each with the fix)."""
    problems = []
    config_path = found.folder / "model-config.yaml"
    handler = found.handler_config().get("handler") or {}
    allowed = {*found.lane_names, DEFAULT_LANE}
    for key, value in handler.items():
        if isinstance(value, Mapping):
            strays = sorted(set(value) - allowed)
            if strays:
                problems.append(
                    f"{config_path}: handler.{key} names lane(s) {', '.join(strays)}, which {found.folder / MODEL_FILE} "
                    f"does not declare; the lanes are {', '.join(found.lane_names)} (or `default` for every lane not named)"
                )
    if not (found.folder / "archive.py").exists():
        problems.append(f"{found.folder}: no archive.py with artifacts(version, build_dir, fmt, precision)")
    if not (found.folder / "portable.py").exists():
        problems.append(
            f"{found.folder}: no portable.py declaring PORTABLE, how the GPU check rebuilds the model from plain weights "
            f"(models/portable.py says what)"
        )
    try:
        samples = found.samples()
    except (RegistryError, ValueError) as error:
        problems.append(str(error))
    else:
        if found.bench["request"] >= len(samples.instances):
            problems.append(
                f"{found.folder / MODEL_FILE}: bench.request is {found.bench['request']}, but {SAMPLES_FILE} holds "
                f"{len(samples.instances)} samples (0..{len(samples.instances) - 1})"
            )
        for position, answer in enumerate(samples.answers):
            mismatch = samples.problem(answer, answer)
            if mismatch:
                problems.append(f"{found.folder / SAMPLES_FILE}: sample {position}'s answer fails its own match: {mismatch}")
    return problems


def write_samples(folder: Path, pairs: Sequence[tuple[Any, Any]], match: Mapping[str, Any], min_agreement: float = 1.0) -> Path:
    """models/<name>/samples.json from (instance, answer) pairs (the model's samples.py calls this)."""
    path = folder / SAMPLES_FILE
    samples = [{"instance": instance, "answer": answer} for instance, answer in pairs]
    document = {"match": dict(match), "min_agreement": min_agreement, "samples": samples}
    path.write_text(json.dumps(document, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path


def load_models_value() -> str:
    return ",".join(f"{lane.name}={lane.model}.mar" for lane in lanes())


def models_value() -> dict[str, Any]:
    return {lane.name: lane.torchserve_entry() for lane in lanes()}


def properties_block() -> str:
    """config.properties' load_models= and models= lines for every lane the folders declare, one lane a line."""
    entries = [f"  {json.dumps(name)}: {json.dumps(entry)}" for name, entry in models_value().items()]
    return f"load_models={load_models_value()}\nmodels={{\\\n" + ",\\\n".join(entries) + "\\\n}"


def rewrite_properties(path: Path) -> bool:
    """Replace `path`'s load_models= line and models={...} block with the folders' (True when it changed)."""
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("load_models=")), None)
    if start is None or not lines[start + 1].startswith("models={"):
        raise RegistryError(f"{path}: expected a load_models= line followed by a models={{...}} block to rewrite")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].rstrip() == "}")
    text = "\n".join([*lines[:start], properties_block(), *lines[end + 1 :]]) + "\n"
    changed = text != path.read_text()
    if changed:
        path.write_text(text)
    return changed


OBJECTIVE_RECORD = "      - record: lane:latency_objective_seconds"


def objectives_block() -> str:
    """monitoring/alerts.yml's lane:latency_objective_seconds rule: each stream lane's p99_objective_s."""
    terms = [
        f'label_replace(vector({lane.p99_objective_s:g}), "lane", "{lane.name}", "", "")' for lane in lanes() if not lane.bulk
    ]
    body = "\n".join(f"          {'or ' if i else ''}{term}" for i, term in enumerate(terms))
    return f"{OBJECTIVE_RECORD}\n        expr: |\n{body}"


def rewrite_alerts(path: Path) -> bool:
    """Replace the objective rule's expression in `path` with the folders' (True when it changed)."""
    lines = path.read_text().splitlines()
    start = lines.index(OBJECTIVE_RECORD)
    end = start + 2
    while end < len(lines) and lines[end].startswith("          "):
        end += 1
    text = "\n".join([*lines[:start], objectives_block(), *lines[end:]]) + "\n"
    changed = text != path.read_text()
    if changed:
        path.write_text(text)
    return changed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "names"
    if command == "names":
        print("\n".join(models()))
    elif command == "sources":
        print(" ".join(str(p.relative_to(HERE.parent)) for p in model(args[1]).sources()))
    elif command == "check":
        problems = [problem for found in models().values() for problem in check(found)]
        print("\n".join(problems) or f"{len(models())} models, {len(lanes())} lanes: consistent")
        return 1 if problems else 0
    elif command == "properties" and args[1:2] == ["--write"]:
        for path in map(Path, args[2:]):
            print(f"{path}: {'rewritten' if rewrite_properties(path) else 'up to date'}")
    elif command == "properties":
        print(properties_block())
    elif command == "alerts" and args[1:2] == ["--write"]:
        for path in map(Path, args[2:]):
            print(f"{path}: {'rewritten' if rewrite_alerts(path) else 'up to date'}")
    else:
        print(
            f"unknown command {command!r}: names | sources NAME | check | properties [--write FILE...] | alerts --write FILE",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
