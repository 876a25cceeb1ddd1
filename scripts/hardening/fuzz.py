"""Fuzz the inference API with schemathesis, from the OpenAPI description TorchServe serves at `OPTIONS /`.

    python -m scripts.hardening.fuzz                                # its own TorchServe on free ports (make fuzz)
    python -m scripts.hardening.fuzz --max-examples 20 --max-time 30
    python -m scripts.hardening.fuzz --running                      # `make serve`'s server (config.properties)

TorchServe describes every model as one `POST /predictions/{model_name}` taking `*/*` bytes, under an
operationId it also gives two other operations, beside paths this port does not serve (/metrics), and
without its token auth. `repair()` keeps TorchServe's operation and responses and fixes those: one path
per lane, a unique operationId, the request bodies its model's task declares (handlers/tasks: `request_bodies`,
JSON instances and raw bodies), the 4xx answers of the contract and the bearer token. Every lane of every model
in models/ is fuzzed. schemathesis then sends schema-valid and
schema-violating requests to each lane (its coverage and fuzzing phases, positive and negative modes).

Passes when no request got a 5xx (schemathesis' not_a_server_error check), no lane's worker restarted
(worker pids from the management API before and after) and each lane answers its model's samples
(models/<name>/samples.json) as they must be answered, before the run and after it.
"""

from __future__ import annotations

import copy
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import requests
import schemathesis

from handlers.tasks import TASKS
from models import registry
from scripts import cli
from scripts.errors import ScriptError
from scripts.hardening import subject
from scripts.layout import BUILD, JSON
from scripts.server.endpoints import Endpoints
from scripts.server.samples_gate import GateResult, gate
from scripts.swap.management import ManagementApi

PREDICTIONS = "/predictions/{model_name}"


def lanes_of(models: tuple[str, ...] | None = None) -> dict[str, str]:
    """{lane: model} for every lane of `models` (default: every model the folders declare)."""
    return {lane.name: lane.model for lane in registry.lanes() if models is None or lane.model in models}


def request_bodies(model: str) -> dict[str, dict]:
    """The request bodies `model`'s task accepts, by media type (its task's `request_bodies`)."""
    return copy.deepcopy(dict(TASKS[registry.model(model).task].request_bodies))


class FuzzError(ScriptError):
    """The description could not be fetched or repaired, or the run could not start."""


# --- the description: fetch, find what is wrong, repair ----------------------------------------------------


def fetch_description(endpoints: Endpoints) -> dict:
    """TorchServe's own OpenAPI description of its inference API (`OPTIONS /` on the inference port)."""
    try:
        reply = requests.options(f"{endpoints.inference}/", headers=endpoints.auth("inference"), timeout=30)
    except requests.ConnectionError:
        raise FuzzError(f"no TorchServe inference API at {endpoints.inference}") from None
    if reply.status_code != 200:
        raise FuzzError(f"OPTIONS / answered HTTP {reply.status_code}: {reply.text[:200]}")
    return reply.json()


def problems(description: dict) -> list[str]:
    """What keeps a description from being OpenAPI 3.0 a fuzzer can trust (beyond its JSON schema, which
    TorchServe's passes): rules of the specification's text, and bodies that describe nothing."""
    found = []
    operation_ids = Counter()
    for path, methods in description.get("paths", {}).items():
        for method, operation in methods.items():
            operation_ids[operation.get("operationId")] += 1
            declared = {p["name"] for p in operation.get("parameters", []) if p.get("in") == "path"}
            for name in _templated(path) - declared:
                found.append(f"{method.upper()} {path}: path variable {{{name}}} has no path parameter")
            for media_type, content in operation.get("requestBody", {}).get("content", {}).items():
                if media_type == "*/*" and content.get("schema", {}).get("format") == "binary":
                    found.append(f"{method.upper()} {path}: request body is any bytes of any type (*/*)")
    for operation_id, count in operation_ids.items():
        if operation_id is not None and count > 1:
            found.append(f"operationId {operation_id!r} is used by {count} operations (it must be unique)")
    if "/metrics" in description.get("paths", {}):
        found.append("GET /metrics is described on the inference API but served on the metrics port")
    if "security" not in description and "securitySchemes" not in description.get("components", {}):
        found.append("no security scheme: every call needs the inference token (Authorization: Bearer)")
    return found


def _templated(path: str) -> set[str]:
    names, rest = set(), path
    while "{" in rest and "}" in rest:
        start = rest.index("{")
        end = rest.index("}", start)
        names.add(rest[start + 1 : end])
        rest = rest[end + 1 :]
    return names


ERROR = {
    "type": "object",
    "required": ["code", "type", "message"],
    "properties": {"code": {"type": "integer"}, "type": {"type": "string"}, "message": {"type": "string"}},
}
# The contract's answers besides TorchServe's own 404/500/503 (docs/architecture.md §5).
ANSWERS = {
    "400": "Bad input: the message names the field, the expected shape or type, or the limit",
    "401": "Missing or wrong inference token",
    "413": "Over a limit (rows, pixels, text bytes, max_request_size); the message names it",
    "507": "A row that cannot fit in memory even alone",
}


def repair(description: dict, lanes: dict[str, str] | None = None) -> dict:
    """A valid description of the prediction endpoints of `lanes` ({lane: model}; default every lane), built on
    TorchServe's."""
    lanes = lanes if lanes is not None else lanes_of()
    try:
        served = description["paths"][PREDICTIONS]["post"]
    except KeyError:
        paths = sorted(description.get("paths", {}))
        raise FuzzError(f"TorchServe's description has no POST {PREDICTIONS}: paths {paths}") from None
    paths = {}
    for lane, model in lanes.items():
        operation = copy.deepcopy(served)
        operation["operationId"] = f"predict_{lane.replace('-', '_')}"
        operation["parameters"] = [p for p in operation.get("parameters", []) if p.get("name") != "model_name"]
        operation["requestBody"] = {
            "required": True,
            "content": {media_type: {"schema": schema} for media_type, schema in request_bodies(model).items()},
        }
        responses = operation.setdefault("responses", {})
        for status, text in ANSWERS.items():
            responses.setdefault(status, {"description": text, "content": {JSON: {"schema": ERROR}}})
        paths[f"/predictions/{lane}"] = {"post": operation}
    return {
        "openapi": description.get("openapi", "3.0.1"),
        "info": description.get("info", {"title": "TorchServe inference API", "version": "0"}),
        "paths": paths,
        "components": {"securitySchemes": {"token": {"type": "http", "scheme": "bearer"}}},
        "security": [{"token": []}],
    }


# --- the run -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One request schemathesis sent and what came back; `text()` cuts the bodies to `BODY_CHARS`."""

    method: str
    url: str
    content_type: str
    body: str
    status: int | None
    answer: str

    def text(self) -> str:
        return f"{self.method} {self.url} [{self.content_type}] {_clip(self.body)!r} -> HTTP {self.status} {_clip(self.answer)!r}"


@dataclass
class FuzzRun:
    """What one schemathesis run sent and what it found."""

    requests: int = 0
    statuses: Counter = field(default_factory=Counter)  # HTTP status -> count
    by_lane: Counter = field(default_factory=Counter)  # lane -> requests
    failures: list[str] = field(default_factory=list)  # a failed check, with the request that failed it
    server_errors: list[Exchange] = field(default_factory=list)  # every 5xx, and every request left unanswered
    errors: list[str] = field(default_factory=list)  # schemathesis could not send or check a case
    stop_reason: str = ""
    seconds: float = 0.0


BODY_CHARS = 300


def fuzz(endpoints: Endpoints, description: dict, max_examples: int, max_time: int | None, seed: int | None = None) -> FuzzRun:
    """Run schemathesis (every phase but stateful, positive and negative data) against `description`."""
    settings = {
        "base-url": endpoints.inference,
        "headers": endpoints.auth("inference"),
        "workers": 1,  # one request at a time: a 5xx is then this request's, not its batch neighbour's
        "request-timeout": 120,
        "checks": {"enabled": False, "not_a_server_error": {"enabled": True}},
        "generation": {"mode": "all", "max-examples": max_examples, "database": "none"},
        "phases": {"stateful": {"enabled": False}},
        "suppress-health-check": ["all"],
    }
    if max_time is not None:
        settings["max-time"] = max_time
    if seed is not None:
        settings["seed"] = seed
    config = schemathesis.Config.from_dict(settings)
    schema = schemathesis.openapi.from_dict(description, config=config)
    run = FuzzRun()
    started = time.monotonic()
    for event in schemathesis.engine.from_schema(schema).execute():
        _record(run, event)
    run.seconds = time.monotonic() - started
    return run


def _record(run: FuzzRun, event) -> None:
    from schemathesis.engine import events

    if isinstance(event, (events.ScenarioFinished, events.FuzzScenarioFinished)):
        recorder = event.recorder
        for interaction in recorder.interactions.values():
            exchange = _exchange(interaction)
            run.requests += 1
            run.statuses[exchange.status] += 1
            run.by_lane[exchange.url.rsplit("/predictions/", 1)[-1]] += 1
            if exchange.status is None or exchange.status >= 500:
                run.server_errors.append(exchange)
        for case_id, checks in recorder.checks.items():
            for check in checks:
                if check.failure_info is not None:
                    interaction = recorder.interactions.get(case_id)
                    sent = _exchange(interaction).text() if interaction else "(no request recorded)"
                    run.failures.append(f"{check.name}: {check.failure_info.failure.title}: {sent}")
    elif isinstance(event, (events.NonFatalError, events.FatalError)):
        error = getattr(event, "value", None) or getattr(event, "exception", None)
        run.errors.append(f"{type(error).__name__}: {error}"[:500])
    elif isinstance(event, events.EngineFinished):
        run.stop_reason = str(event.stop_reason)


def _exchange(interaction) -> Exchange:
    request, response = interaction.request, interaction.response
    body = request.body or b""
    return Exchange(
        method=request.method,
        url=request.uri,
        content_type=_first(request.headers.get("Content-Type") or request.headers.get("content-type")),
        body=body.decode("utf-8", errors="backslashreplace"),
        status=response.status_code if response is not None else None,
        answer=response.content.decode("utf-8", errors="backslashreplace") if response is not None else "(no response)",
    )


def _first(value) -> str:
    return (value[0] if isinstance(value, list) else value) or ""


def _clip(text: str) -> str:
    return text if len(text) <= BODY_CHARS else f"{text[:BODY_CHARS]}... ({len(text)} characters)"


# --- the lanes before and after ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LaneState:
    """Each lane's worker pids and how it answered its model's samples (the hot-swap gate's check)."""

    worker_pids: dict[str, tuple[int, ...]]
    answers: dict[str, GateResult]


def lane_state(endpoints: Endpoints, lanes: dict[str, str]) -> LaneState:
    management = ManagementApi(endpoints)
    pids = {lane: management.worker_pids(lane) for lane in lanes}
    return LaneState(pids, {lane: gate(endpoints, lane) for lane in lanes})


def changes(before: LaneState, after: LaneState) -> list[str]:
    """What the run broke: a restarted worker, or a lane that no longer answers its samples as it must."""
    found = []
    for lane, pids in before.worker_pids.items():
        if after.worker_pids.get(lane) != pids:
            found.append(f"{lane}: workers {list(pids)} before, {list(after.worker_pids.get(lane, ()))} after (a restart)")
    found += [f"after the run: {answer.summary()}" for answer in after.answers.values() if not answer.passed]
    return found


@dataclass
class FuzzReport:
    description_problems: list[str]
    run: FuzzRun
    before: LaneState
    after: LaneState
    seed: int

    @property
    def failures(self) -> list[str]:
        found = [f"{_status(e.status)} for bad input: {e.text()}" for e in self.run.server_errors]
        found += [f for f in self.run.failures if not f.startswith("not_a_server_error")]
        found += [f"schemathesis could not run a case: {e}" for e in self.run.errors]
        found += changes(self.before, self.after)
        if self.run.requests == 0:
            found.append("schemathesis sent no request")
        return found

    def text(self) -> str:
        run = self.run
        statuses = ", ".join(f"{status}: {count}" for status, count in sorted(run.statuses.items(), key=str))
        lanes = ", ".join(f"{lane} {count}" for lane, count in sorted(run.by_lane.items()))
        lines = [
            f"TorchServe's description, repaired: {len(self.description_problems)} problems",
            *(f"  - {problem}" for problem in self.description_problems),
            f"schemathesis {schemathesis.__version__}: {run.requests} requests in {run.seconds:.0f}s ({run.stop_reason}),"
            f" seed {self.seed}",
            f"  by lane: {lanes}",
            f"  by status: {statuses}",
            f"worker pids before {_pids(self.before)}, after {_pids(self.after)}",
        ]
        failures = self.failures
        lines.append("PASS: no 5xx, no worker restart, every lane answers its samples" if not failures else "FAIL:")
        lines += [f"  - {failure}" for failure in failures]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        run = self.run
        return {
            "description_problems": self.description_problems,
            "seed": self.seed,
            "requests": run.requests,
            "seconds": round(run.seconds, 1),
            "stop_reason": run.stop_reason,
            "by_lane": dict(run.by_lane),
            "statuses": {str(status): count for status, count in run.statuses.items()},
            "worker_pids_before": self.before.worker_pids,
            "worker_pids_after": self.after.worker_pids,
            "samples_after": {lane: answer.summary() for lane, answer in self.after.answers.items()},
            "failures": self.failures,
            "server_errors": [asdict(exchange) for exchange in run.server_errors],  # whole bodies, to replay
        }


def _status(status: int | None) -> str:
    return f"HTTP {status}" if status is not None else "no answer"


def _pids(state: LaneState) -> str:
    return " ".join(f"{lane}={','.join(map(str, pids))}" for lane, pids in state.worker_pids.items())


def check(
    endpoints: Endpoints,
    max_examples: int,
    max_time: int | None,
    lanes: dict[str, str] | None = None,
    seed: int | None = None,
    described_by: Endpoints | None = None,
) -> FuzzReport:
    """Fetch and repair the description (from `described_by`: TorchServe's own listener, where `endpoints` is the
    front door, which serves no description), note the lanes, fuzz, note the lanes again."""
    lanes = lanes if lanes is not None else lanes_of()
    raw = fetch_description(described_by or endpoints)
    before = lane_state(endpoints, lanes)
    unready = [answer.summary() for answer in before.answers.values() if not answer.passed]
    if unready:
        raise FuzzError(f"a lane does not answer its samples before the run: {'; '.join(unready)}")
    seed = seed if seed is not None else random.randrange(2**32)
    run = fuzz(endpoints, repair(raw, lanes), max_examples, max_time, seed)
    return FuzzReport(problems(raw), run, before, lane_state(endpoints, lanes), seed)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--max-examples", type=int, default=200, help="examples per lane and phase (default %(default)s)")
    parser.add_argument("--max-time", type=int, default=240, help="stop generating after this many seconds (default %(default)s)")
    parser.add_argument("--seed", type=int, help="hypothesis seed, to replay a run (default: a new one, printed)")
    subject.add_options(parser, BUILD / "fuzz.json")
    args = parser.parse_args(argv)
    with subject.subject(args) as server:
        report = check(server.endpoints, args.max_examples, args.max_time, seed=args.seed, described_by=server.torchserve)
    return subject.finish(report, args.report)


if __name__ == "__main__":
    cli.run(lambda: main())
