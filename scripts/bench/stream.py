"""`make bench` (stream half): each model's stream lane against what a user would pick instead, in one run.

    python -m scripts.bench.stream [--quick] [--models NAME ...] [--precision bf16] [--no-report]

Per model, one after the other on this machine, every system serving the same archive's core with the
same workers and torch threads, under the same load (wrk: closed loop; k6: open loop) and the same
one-row JSON body:
  - in-process pipeline: decode, collate, forward, unbatch and JSON on one torch thread at the lane's
    batch size; its CPU per request gives the ceiling (cores / CPU per request);
  - one TorchServe with four lanes: the model's stream lane as config.properties sets it; the same
    archive with batchSize 1 (TorchServe without dynamic batching); a no-op handler with the lane's
    batching (the transport floor, whose CPU per request under load gives, with the pipeline's, the
    CPU limit); the no-op handler with batchSize 1 (what a lone request costs TorchServe);
  - the field (scripts/bench/peers/, run by scripts/bench/rivals.py): Flask + gunicorn, one forward per
    request; LitServe, Ray Serve, BentoML and PyTriton (Triton) with their batching on, each with the settings
    its sweep kept (python -m scripts.bench.sweep), each checked to answer as the lane does before timing.
Closed loop at 1, 4, 16 and 64 connections, then an open-loop sweep of offered rates (fractions of the
lane's closed-loop rate) on the lane and batchSize 1; also where a lone request's milliseconds go (scripts/bench/
attribution.py) and the bytes the server's logs grow by per request, at the default log settings and with
the access log on. Writes build/bench/stream.json, the stream section of docs/benchmarks.md and PNG plots
in docs/bench/.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from dataclasses import asdict, dataclass, replace
from datetime import date
from pathlib import Path

import orjson
import requests
import torch

from models import registry
from scripts import cli
from scripts.archive.variant import write_variant
from scripts.bench import attribution, loadgen, plots, rivals
from scripts.bench.peers.noop_handler import build_noop_archive
from scripts.bench.peers.roster import peers
from scripts.bench.pipeline import image_stages, pipeline, server_cpu
from scripts.bench.report import machine, replace_section
from scripts.bench.results import ModelBench
from scripts.errors import ScriptError
from scripts.layout import BUILD, JSON, MODEL_STORE, ROOT
from scripts.server.config import LaneSettings, ServerConfig
from scripts.server.temporary import serving_in

LANE, BATCH1, FLOOR, FLOOR1, FLASK = "lane", "batchSize 1", "no-op floor", "no-op batchSize 1", "Flask"
REPORT_DIR = ROOT / "docs" / "bench"


@dataclass(frozen=True)
class Plan:
    """How long and how hard: the full run for docs/benchmarks.md, or --quick (under 3 minutes in all)."""

    # Sized so five peers fit one run under 15 minutes with every connection count of the plots (1-64 in
    # powers of 2): 2.5 s per point after 0.5 s of warm-up, the open loop on the TorchServe lanes only.
    connections: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    seconds: float = 2.5
    warmup: float = 0.5
    rate_fractions: tuple[float, ...] = (0.25, 0.5, 1.0, 1.25)
    open_seconds: float = 4.0
    lone_seconds: float = 5.0
    server_warmup: float = 3.0  # each TorchServe lane at 64 connections before any measured run
    open_systems: tuple[str, ...] = (LANE, BATCH1)
    pipeline_seconds: float = 3.0
    access_log: bool = True  # models whose goals name log bytes: the bytes per request with the access log on

    def for_cost(self, cpu_ms: float, workers: int, cores: int) -> Plan:
        """This plan for a model whose requests queue for seconds at the top load (an image classifier on a few
        cores: there a request waits about top connections x its CPU ms / the workers, taken twice for the
        server's own costs). Where that wait is over a quarter of a point, each point runs at least twice it after a
        warm-up of it, at 1, 4, 16 and 64 connections of the plan's; else the plan as it is."""
        latency = 2 * self.connections[-1] * cpu_ms / 1000 / max(1, min(workers, cores))
        if latency <= self.seconds / 4:
            return self
        fewer = tuple(c for c in self.connections if c in (1, 4, 16, 64)) or self.connections
        longer = max(self.seconds, 2 * latency)
        return replace(self, connections=fewer, seconds=round(longer), warmup=round(max(self.warmup, latency)),
                       open_seconds=round(max(self.open_seconds, longer)))  # fmt: skip


QUICK = Plan(connections=(1, 64), seconds=2.0, warmup=1.0, rate_fractions=(0.5, 1.0), open_seconds=2.0,
             open_systems=(), pipeline_seconds=1.0, lone_seconds=1.0, server_warmup=1.0, access_log=False)  # fmt: skip


def request_body(model: str) -> bytes:
    """One row as an interactive client sends it: the sample models/<model>/model.yaml's bench.request names."""
    try:
        found = registry.model(model)
    except registry.RegistryError as error:
        raise ScriptError(f"no benchmark body for model {model!r}: {error}") from None
    return orjson.dumps({"instances": [found.samples().instances[found.bench["request"]]]})


def check_answer(model: str, reply: requests.Response, system: str) -> None:
    """Every system must give the body's sample answer (models/<model>/samples.json) before its speed counts."""
    found = registry.model(model)
    samples, index = found.samples(), found.bench["request"]
    body = reply.json() if reply.status_code == 200 else None
    predictions = body.get("predictions") if isinstance(body, dict) else None
    problem = "no predictions" if not isinstance(predictions, list) or len(predictions) != 1 else None
    problem = problem or samples.problem(predictions[0], samples.answers[index])
    if problem:
        raise ScriptError(
            f"{system} answered HTTP {reply.status_code} {reply.text[:200]!r}, not the {model} sample's answer: {problem}"
        )


def lane_entry(mar: str, lane: LaneSettings, batch_size: int) -> dict:
    """One lane's models= entry: `lane`'s workers and batching from config.properties, on archive `mar`."""
    settings = {"marName": mar, "minWorkers": lane.workers, "maxWorkers": lane.workers, "batchSize": batch_size}
    return {"1.0": {**settings, "maxBatchDelay": lane.max_batch_delay, "responseTimeout": lane.response_timeout}}


def served_lanes(lanes: dict[str, dict]) -> dict[str, str]:
    """config.properties overrides (load_models, models=) serving exactly `lanes` ({name: lane_entry(...)})."""
    load = ",".join(f"{name}={versions['1.0']['marName']}" for name, versions in lanes.items())
    return {"load_models": load, "models": json.dumps(lanes)}


def lanes_config(model: str, lane: LaneSettings) -> dict[str, str]:
    """load_models and models= for the four TorchServe lanes of one model's run."""
    return served_lanes(
        {
            model: lane_entry(f"{model}.mar", lane, lane.batch_size),
            f"{model}-b1": lane_entry(f"{model}.mar", lane, 1),
            "noop": lane_entry("noop.mar", lane, lane.batch_size),
            "noop-b1": lane_entry("noop.mar", lane, 1),
        }
    )


def closed_runs(target: loadgen.Target, plan: Plan) -> list[dict]:
    return [rivals.closed_run(target, connections, plan.seconds, plan.warmup) for connections in plan.connections]


def open_runs(target: loadgen.Target, rates: list[float], plan: Plan) -> list[dict]:
    runs = []
    for rate in rates:
        result = loadgen.open_loop(target, rate, plan.open_seconds)
        print(f"    {result.row()}", flush=True)
        runs.append(asdict(result))
    return runs


def bench_model(model: str, plan: Plan, workdir: Path, precision: str | None = None) -> ModelBench:
    archive = MODEL_STORE / f"{model}.mar"
    if precision is not None:  # the same archive with handler.precision changed (e.g. bf16 autocast on CUDA)
        archive = write_variant(archive, workdir / f"{model}-{precision}" / f"{model}.mar", {"precision": precision})
    lane = ServerConfig.read().lane_settings(model)[model]
    result = ModelBench(model, lane, os.cpu_count() or 1)
    body = request_body(model)
    print(f"{model}: in-process pipeline at batch {lane.batch_size}, one thread", flush=True)
    measured = pipeline(archive, body, lane.batch_size, plan.pipeline_seconds)
    result.pipeline_cpu_ms, result.pipeline_rps_one_thread = measured.cpu_ms_per_request, measured.requests_per_second
    result.image_stages = image_stages(archive, body, plan.pipeline_seconds) or {}
    given, plan = plan, plan.for_cost(measured.cpu_ms_per_request, lane.workers, result.cores)
    result.plan = plan
    if plan != given:
        print(f"  {model}: {plan.seconds:g} s a point after {plan.warmup:g} s, at {plan.connections} connections", flush=True)
    targets: dict[str, loadgen.Target] = {}
    expected: dict = {}  # the lane's answer: every peer must give the same
    noop = build_noop_archive(workdir / "noop")
    with serving_in(
        workdir / f"torchserve-{model}", {f"{model}.mar": archive, "noop.mar": noop}, lanes_config(model, lane)
    ) as server:
        token = server.endpoints.token("inference")
        names = {LANE: model, BATCH1: f"{model}-b1", FLOOR: "noop", FLOOR1: "noop-b1"}
        for system, name in names.items():
            targets[system] = loadgen.Target(server.endpoints.prediction_url(name), body, JSON, token)
            if system in (LANE, BATCH1):
                reply = requests.post(targets[system].url, data=body, headers=targets[system].headers(), timeout=60)
                check_answer(model, reply, system)
                expected = expected or reply.json()
        for system in (LANE, BATCH1, FLOOR, FLOOR1):  # warm before traffic, as `make serve` does (its JIT, first calls)
            loadgen.closed_loop(targets[system], 64, plan.server_warmup)
        for system in (LANE, BATCH1, FLOOR, FLOOR1):
            print(f"  {system} ({names[system]})", flush=True)
            logs_before = attribution.log_bytes(server.workdir)
            if system in (FLOOR, LANE):  # the last (highest) load also charges the server's CPU to the requests it served
                result.closed[system] = closed_runs(targets[system], replace(plan, connections=plan.connections[:-1]))
                last = plan.connections[-1]
                loadgen.closed_loop(targets[system], last, plan.warmup)  # warm-up, not charged

                def measured(system: str = system, last: int = last) -> int:
                    run = loadgen.closed_loop(targets[system], last, plan.seconds)
                    print(f"    {run.row()}", flush=True)
                    result.closed[system].append(asdict(run))
                    return run.requests

                result.server_cpu_ms[system] = server_cpu(server.process.pid, measured).cpu_ms_per_request
                result.floor_cpu_ms = result.server_cpu_ms.get(FLOOR, 0.0)
                print(f"    {system} CPU per request at {last} connections: {result.server_cpu_ms[system]:.3f} ms", flush=True)
            else:
                result.closed[system] = closed_runs(targets[system], plan)
            if system == LANE:
                answered = sum(run["requests"] for run in result.closed[system])
                result.log_bytes["default"] = (attribution.log_bytes(server.workdir) - logs_before) / answered
                print(f"    logs: {result.log_bytes['default']:.1f} bytes per request", flush=True)
        if plan.lone_seconds:
            for system in (FLOOR, LANE):
                result.lone[system] = attribution.lone_request(server, names[system], targets[system], plan.lone_seconds).row()
                print(f"    lone request, {system}: {result.lone[system]}", flush=True)
        top_rate = result.at(LANE, plan.connections[-1])["rps"]  # 0 when the lane served nothing there: no open loop
        rates = [rate for fraction in plan.rate_fractions if (rate := round(fraction * top_rate)) > 0]
        for system in (LANE, BATCH1):
            if system in plan.open_systems:
                print(f"  {system}: open loop", flush=True)
                result.open[system] = open_runs(targets[system], rates, plan)
    if plan.access_log and "log_bytes_per_request" in registry.model(model).bench["stream_goals"]:
        result.log_bytes["access log on"] = access_log_bytes(model, archive, lane, body, plan, workdir)
    for peer in peers():
        opened = (lambda target: open_runs(target, rates, plan)) if peer.name in plan.open_systems else None
        rivals.run_peer(peer, model, archive, body, expected, result, plan.connections, plan.seconds, plan.warmup, opened)
    return result


def access_log_bytes(model: str, archive: Path, lane: LaneSettings, body: bytes, plan: Plan, workdir: Path) -> float:
    """Bytes the logs grow by per request on the stream lane with the access log switched on (-Daccess_log=all)."""
    vmargs = ServerConfig.read().vmargs + " -Daccess_log=all"
    config = {**lanes_config(model, lane), "vmargs": vmargs}
    with serving_in(
        workdir / f"torchserve-{model}-access", {f"{model}.mar": archive, "noop.mar": workdir / "noop" / "noop.mar"}, config
    ) as server:
        target = loadgen.Target(server.endpoints.prediction_url(model), body, JSON, server.endpoints.token("inference"))
        loadgen.closed_loop(target, 16, plan.warmup)
        before = attribution.log_bytes(server.workdir)
        run = loadgen.closed_loop(target, 16, plan.seconds)
        grown = (attribution.log_bytes(server.workdir) - before) / max(run.requests, 1)
    print(f"  access log on: {grown:.1f} bytes per request", flush=True)
    return grown


# -- report -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One goal of a model's bench.stream_goals, stated as a ratio or a difference measured in this run."""

    name: str
    value: float | None  # None: not measured (a side completed no request)
    bound: float
    higher_is_better: bool = True
    unit: str = "x"
    detail: str = ""

    @property
    def met(self) -> bool:
        if self.value is None:
            return False
        return self.value >= self.bound if self.higher_is_better else self.value <= self.bound

    def row(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        verdict = "met" if self.met else "**missed**"
        detail = f" ({self.detail})" if self.detail else ""
        measured = "not measured" if self.value is None else f"{self.value:.2f}{self.unit}"
        return f"| {self.name} | {measured}{detail} | {sign} {self.bound:g}{self.unit} | {verdict} |"


def _unserved(bench: ModelBench, other: str, connections: int) -> str | None:
    """Why lane vs `other` at `connections` has no figure (a side completed no request), or None."""
    for system in (LANE, other):
        if not rivals.served(bench.run(system, connections)):
            why = "did not run" if system in bench.failed else "no requests completed"
            return f"{system}: {why}"
    return None


def _p50_over(bench: ModelBench, other: str, bound: float) -> Target:
    name = f"lane p50 minus {other} p50, 1 connection"
    if why := _unserved(bench, other, 1):
        return Target(name, None, bound, False, " ms", why)
    lane, peer = bench.at(LANE, 1)["p50_ms"], bench.at(other, 1)["p50_ms"]
    return Target(name, lane - peer, bound, False, " ms", f"{lane:.2f} vs {peer:.2f} ms")


def _rate_over(bench: ModelBench, other: str, connections: int, bound: float) -> Target:
    name = f"lane / {other} at {connections} connections"
    if why := _unserved(bench, other, connections):
        return Target(name, None, bound, detail=why)
    lane, peer = bench.at(LANE, connections)["rps"], bench.at(other, connections)["rps"]
    return Target(name, lane / peer, bound, detail=f"{lane:,.0f} vs {peer:,.0f} req/s")


def targets(bench: ModelBench, top: int) -> list[Target]:
    """The stream goals the model's folder sets (model.yaml's bench.stream_goals; each goal it names is checked)."""
    lane = bench.at(LANE, top)
    goal = registry.model(bench.model).bench["stream_goals"]
    middle = [c for c in (4, 16) if c in bench.connections()]
    found = []
    if "p50_over_flask_ms" in goal:
        found.append(_p50_over(bench, FLASK, goal["p50_over_flask_ms"]))
    if "p50_over_floor_ms" in goal:
        found.append(_p50_over(bench, FLOOR, goal["p50_over_floor_ms"]))
    if "rate_over_flask_mid" in goal:
        found += [_rate_over(bench, FLASK, c, goal["rate_over_flask_mid"]) for c in middle]
    if "share_of_cpu_limit_top" in goal:
        share = lane["rps"] / bench.cpu_limit if bench.floor_cpu_ms else None
        detail = f"{lane['rps']:,.0f} of {bench.cpu_limit:,.0f} req/s"
        found.append(Target(f"lane / CPU limit at {top} connections", share, goal["share_of_cpu_limit_top"], detail=detail))
    if "rate_over_flask_top" in goal:
        found.append(_rate_over(bench, FLASK, top, goal["rate_over_flask_top"]))
    if "rate_over_batch1_top" in goal:
        found.append(_rate_over(bench, BATCH1, top, goal["rate_over_batch1_top"]))
    if "p99_top_ms" in goal:
        p99 = goal["p99_top_ms"]
        found.append(Target(f"lane p99 at {top} connections", lane["p99_ms"], p99, higher_is_better=False, unit=" ms"))
    if "share_of_pipeline_top" in goal:
        share = lane["rps"] / bench.ceiling if bench.pipeline_cpu_ms else None
        found.append(Target(f"lane / in-process pipeline (all cores) at {top} connections", share, goal["share_of_pipeline_top"]))
    if "log_bytes_per_request" in goal and "access log on" in bench.log_bytes:
        found.append(
            Target(
                "bytes written to logs per request, access log on",
                bench.log_bytes["access log on"],
                goal["log_bytes_per_request"],
                False,
                " B",
                f"{bench.log_bytes.get('default', 0):.1f} B with the default settings",
            )  # fmt: skip
        )
    return found


def model_section(bench: ModelBench, plan: Plan) -> str:
    plan = bench.plan or plan  # the model's own, where its cost lengthened the points
    top = plan.connections[-1]
    lane = bench.lane
    lines = [
        f"### {bench.model}",
        "",
        measured(plan),
        "",
        f"Stream lane: {lane.workers} workers of 1 torch thread, batchSize {lane.batch_size}, "
        f"maxBatchDelay {lane.max_batch_delay} ms. "
        f"Every system serves the same archive's core, 1 torch thread per worker or replica, on the same cores; "
        "each peer's settings are in the field section above. Body: one row as JSON instances, the sample "
        f"model.yaml's bench.request names ({len(request_body(bench.model)):,} bytes).",
        "",
        "Closed loop (wrk): req/s, then p50 / p99 ms, at each number of connections.",
        "",
        "| system | " + " | ".join(f"{c} conn" for c in plan.connections) + f" | / lane at {top} |",
        "| --- | " + " | ".join("---:" for _ in plan.connections) + " | ---: |",
    ]
    lane_top = bench.at(LANE, top)["rps"]
    for system in [*bench.closed, *(name for name in bench.failed if name not in bench.closed)]:
        if system in bench.failed:
            lines.append(f"| {system} | did not run: {bench.failed[system][:300]} |" + " |" * len(plan.connections))
            continue
        cells = [rivals.cell(bench.run(system, connections)) for connections in plan.connections]
        ratio = f"{bench.at(system, top)['rps'] / lane_top:.2f}" if lane_top else "-"
        lines.append(f"| {system} | " + " | ".join(cells) + f" | {ratio} |")
    lines += [
        "",
        f"In-process pipeline at batch {lane.batch_size}: {bench.pipeline_cpu_ms:.3f} ms CPU per request "
        f"({bench.pipeline_rps_one_thread:,.0f} req/s on one thread); "
        f"ceiling on {bench.cores} cores {bench.ceiling:,.0f} req/s. "
        f"No-op floor under load: {bench.floor_cpu_ms:.3f} ms CPU per request. "
        f"CPU limit = {bench.cores} / ({bench.floor_cpu_ms:.3f} + {bench.pipeline_cpu_ms:.3f}) ms "
        f"= {bench.cpu_limit:,.0f} req/s.",
        "",
        "| target | measured | goal | |",
        "| --- | ---: | ---: | --- |",
        *(t.row() for t in targets(bench, top)),
    ]
    if bench.lone:
        lines += [
            "",
            "Where a lone request's milliseconds go (one connection, "
            f"{plan.lone_seconds:g} s each, after the runs above; method: scripts/bench/attribution.py):",
            "",
            *attribution.table(bench.lone),
        ]
    if bench.image_stages:
        total = sum(bench.image_stages.values())
        lines += [
            "",
            "Where one image's milliseconds go in process (the body above, batch 1, one torch thread; "
            "scripts/bench/pipeline.py `image_stages`): "
            + ", ".join(f"{stage} {ms:.2f}" for stage, ms in bench.image_stages.items())
            + f"; {total:.1f} ms in all, forward {bench.image_stages['forward'] / total:.0%}.",
        ]
    if bench.log_bytes:
        sizes = ", ".join(f"{setting}: {value:.1f}" for setting, value in bench.log_bytes.items())
        lines += ["", f"Bytes written to the server's logs/ and stdout per request on the stream lane: {sizes}."]
    if bench.open:
        lines += ["", "Open loop (k6, constant arrival rate): achieved req/s and p50 / p99 ms at each offered rate.", ""]
        rates = [run["offered_rps"] for run in next(iter(bench.open.values()))]
        lines += ["| system | " + " | ".join(f"{rate:,.0f}/s" for rate in rates) + " |", "| --- |" + " ---: |" * len(rates)]
        for system, runs in bench.open.items():
            cells = [_open_cell(run) for run in runs]
            lines.append(f"| {system} | " + " | ".join(cells) + " |")
    for name in plots.write(bench, REPORT_DIR):
        lines += ["", f"![{bench.model}: {name.stem}](bench/{name.name})"]
    return "\n".join(lines)


def _open_cell(run: dict) -> str:
    dropped = f", {run['dropped']} dropped" if run["dropped"] else ""
    return f"{run['rps']:,.0f}, {run['p50_ms']:.1f} / {run['p99_ms']:.1f}{dropped}"


STREAM_SECTION, FIELD_SECTION = "stream bench", "field targets"


def header() -> str:
    return "\n".join(
        [
            "## Stream lanes against the alternatives (`make bench`)",
            "",
            "One section a model (`python -m scripts.bench.stream --models NAME` rewrites only its own), each with the "
            "run it comes from. Every system of a section ran in that one invocation, one at a time, the load generator "
            "on the same cores.",
        ]
    )


def measured(plan: Plan) -> str:
    tools = f"{loadgen.wrk_version()} (closed loop, 1 thread), {loadgen.k6_version()} (open loop)"
    return (
        f"Measured {date.today().isoformat()} on {machine()}; Python {platform.python_version()}, torch {torch.__version__}, "
        f"TorchServe 0.12.0. Load: {tools}, {plan.seconds:g} s per point after a {plan.warmup:g} s warm-up."
    )


def report(benches: list[ModelBench], plan: Plan) -> str:
    return "\n\n".join([header(), *(model_section(bench, plan) for bench in benches)])


def write_report(benches: list[ModelBench], plan: Plan) -> None:
    """The stream and field regions of docs/benchmarks.md: the shared heads, then one region per model run, each
    placed after the regions of the models before it (models/ order); the other models' regions stay as they are."""
    order = list(registry.models())
    when = date.today().isoformat()
    replace_section(STREAM_SECTION, header())
    replace_section(FIELD_SECTION, rivals.field_header(peers(), plan.connections[-1]))
    for bench in benches:
        before = order[: order.index(bench.model)] if bench.model in order else order
        for section, body in (
            (STREAM_SECTION, model_section(bench, plan)),
            (FIELD_SECTION, rivals.field_model_section(bench, peers(), plan.connections[-1], when)),
        ):
            replace_section(f"{section}: {bench.model}", body, after=(section, *(f"{section}: {m}" for m in before)))


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer points (make bench-quick)")
    parser.add_argument("--models", nargs="+", default=list(registry.models()), help="default: every model of models/")
    parser.add_argument("--precision", help="serve the archives with this handler.precision (bf16, fp16: autocast)")
    parser.add_argument("--no-report", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    with tempfile.TemporaryDirectory(prefix="bench-") as folder:
        benches = [bench_model(model, plan, Path(folder), args.precision) for model in args.models]
    (BUILD / "bench").mkdir(parents=True, exist_ok=True)
    (BUILD / "bench" / "stream.json").write_text(json.dumps([asdict(b) for b in benches], indent=1))
    field = [rivals.field_model_section(bench, peers(), plan.connections[-1], date.today().isoformat()) for bench in benches]
    print(report(benches, plan), *field, sep="\n\n")
    if not args.no_report:
        write_report(benches, plan)
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
