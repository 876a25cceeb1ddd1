"""The field in `make bench`: every peer (scripts/bench/peers/field.py) started, checked, timed and stopped, and the
field targets (the lane against the best batching peer, each model's bench.field_goals) with what each system's server
spent per request.

A peer that fails to start, answers wrongly, errors or completes no request is a finding, never a crash: its
row says what happened (the error; errors and timeouts counted), and the targets skip it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import orjson
import psutil
import requests

from models import registry
from scripts.bench import loadgen
from scripts.bench.peers.field import Peer, describe
from scripts.bench.pipeline import tree_cpu_seconds
from scripts.bench.results import ModelBench
from scripts.errors import ScriptError
from scripts.layout import JSON
from scripts.server.process import free_port

LANE = "lane"
ANSWER_TOLERANCE = 1e-4  # scores and embedding components: the same core, so only float printing may differ


def closed_run(target: loadgen.Target, connections: int, seconds: float, warmup: float) -> dict:
    """One wrk run as a dict; a generator failure becomes a run with no requests and the error in `extra`."""
    try:
        result = loadgen.closed_loop(target, connections, seconds, warmup_s=warmup)
    except ScriptError as error:
        result = nothing_served(connections, str(error))
    print(f"    {result.row()}", flush=True)
    return asdict(result)


def nothing_served(connections: int, error: str) -> loadgen.LoadResult:
    return loadgen.LoadResult("wrk", "closed", connections, 0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, extra={"error": error})


def served(run: dict | None) -> bool:
    return bool(run) and run["rps"] > 0


def cell(run: dict | None) -> str:
    """A closed-loop table cell: `req/s, p50 / p99` (errors counted), or why there is no figure."""
    if run is None:
        return "not run"
    errors = f", {run['errors']} errors" if run["errors"] else ""
    timeouts = run.get("extra", {}).get("timeouts", 0)
    if not served(run):
        why = run.get("extra", {}).get("error", "")
        return f"no requests completed ({run['errors']} errors, {timeouts} timeouts{'; ' + why[:120] if why else ''})"
    return f"{run['rps']:,.0f}, {run['p50_ms']:.1f} / {run['p99_ms']:.1f}{errors}"


def same_answer(model: str, expected: dict, got) -> str | None:
    """None when `got` is the lane's answer `expected` (the same keys, lists, labels and integers; floats within
    ANSWER_TOLERANCE), else why not. `model` only names it in the message."""
    try:
        want, have = expected["predictions"][0], got["predictions"][0]
    except (KeyError, IndexError, TypeError) as error:
        return f"not the lane's {model} answer shape ({type(error).__name__}: {error}): {str(got)[:200]}"
    worst = [0.0]
    differs = _differs(want, have, "", worst)
    if differs:
        return differs
    return None if worst[0] <= ANSWER_TOLERANCE else f"numbers differ from the lane's by up to {worst[0]:.2e}"


def _differs(want, have, path: str, worst: list[float]) -> str | None:
    """The first difference of structure or exact value between two parsed JSON answers; the largest difference of
    floats goes to worst[0]."""
    where = path or "the answer"
    if isinstance(want, float) or isinstance(have, float):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (want, have)):
            return f"not the lane's answer shape: {where} is {str(have)[:80]}, a number there"
        worst[0] = max(worst[0], abs(want - have))
        return None
    if isinstance(want, dict):
        if not isinstance(have, dict) or set(have) != set(want):
            keys = sorted(have) if isinstance(have, dict) else type(have).__name__
            return f"not the lane's answer shape: {where} has {keys}, the lane's {sorted(want)}"
        return next((d for key in want if (d := _differs(want[key], have[key], f"{path}.{key}".lstrip("."), worst))), None)
    if isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            return f"not the lane's answer shape: {where} is {str(have)[:80]}, the lane's a list of {len(want)}"
        pairs = enumerate(zip(want, have, strict=True))
        return next((d for i, (a, b) in pairs if (d := _differs(a, b, f"{path}.{i}".lstrip("."), worst))), None)
    return None if want == have else f"{where} {have!r} where the lane says {want!r}"


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children and their descendants alive now: the peer's server tree (wrk runs
    and ends between two readings, so it is never in either)."""
    return sum(tree_cpu_seconds(child.pid) for child in psutil.Process().children())


def run_peer(
    peer: Peer,
    model: str,
    archive: Path,
    body: bytes,
    expected: dict,
    bench: ModelBench,
    connections: tuple[int, ...],
    seconds: float,
    warmup: float,
    open_loop: Callable[[loadgen.Target], list[dict]] | None = None,
) -> None:
    """Start `peer` with its kept settings for `model`, check its answer against the lane's, run the closed loop
    (charging the server tree's CPU to the requests of the last, highest load), stop it. Failures go to bench.failed."""
    settings = peer.settings_for(model)
    bench.peer_settings[peer.name] = settings
    print(f"  {peer.name} ({describe(settings)})", flush=True)
    try:
        with peer.start(archive, free_port(), model, settings) as url:
            target = loadgen.Target(url, peer.wrap(body), JSON)
            reply = requests.post(target.url, data=target.body, headers=target.headers(), timeout=60)
            got = peer.unwrap(orjson.loads(reply.content)) if reply.status_code == 200 else reply.text[:200]
            wrong = same_answer(model, expected, got) if reply.status_code == 200 else f"HTTP {reply.status_code}: {got}"
            if wrong:
                raise ScriptError(f"{peer.name} answered wrongly before timing: {wrong}")
            runs = [closed_run(target, c, seconds, warmup) for c in connections[:-1]]
            loadgen.closed_loop(target, connections[-1], warmup)  # warm-up at the top load, not charged
            before = children_cpu_seconds()
            runs.append(closed_run(target, connections[-1], seconds, 0.0))
            spent = children_cpu_seconds() - before
            bench.closed[peer.name] = runs
            if runs[-1]["requests"]:
                bench.server_cpu_ms[peer.name] = spent * 1000 / runs[-1]["requests"]
            if open_loop is not None:
                bench.open[peer.name] = open_loop(target)
    except Exception as error:  # noqa: BLE001 - any failure of a peer is a finding for the report, not a crash
        reason = f"{type(error).__name__}: {error}"
        bench.failed[peer.name] = reason
        print(f"    {peer.name} failed: {reason}", flush=True)


# -- the field's targets --------------------------------------------------------------------------------------


def best_peer(bench: ModelBench, batching: set[str], connections: int, by: str = "rps") -> str | None:
    """The batching peer with the most req/s (by="rps") or the lowest p50 (by="p50_ms") at `connections`,
    among those that completed requests there; None if none did."""
    candidates = [name for name in batching if served(bench.run(name, connections))]
    if not candidates:
        return None
    if by == "rps":
        return max(candidates, key=lambda name: bench.run(name, connections)["rps"])
    return min(candidates, key=lambda name: bench.run(name, connections)[by])


def field_targets(bench: ModelBench, batching: set[str], top: int) -> list[tuple[str, str, str, str]]:
    """(target, measured, goal, verdict) rows: the field targets for one model, from this run's figures."""
    rows = []
    lane_top = bench.run(LANE, top)
    best = best_peer(bench, batching, top)
    if best is None:
        none = ("no batching peer completed a request", "-", "not measured")
        return [(f"{bench.model} lane against the best batching peer at {top} connections", *none)]
    peer_top = bench.run(best, top)
    ratio = lane_top["rps"] / peer_top["rps"] if served(lane_top) else 0.0
    goals = registry.model(bench.model).bench["field_goals"]  # each goal the model's folder names is checked
    if "rate_over_best_peer_top" in goals:
        goal = goals["rate_over_best_peer_top"]
        rows.append(
            (
                f"{bench.model} lane / best batching peer ({best}) req/s at {top} connections",
                f"{ratio:.2f}x ({lane_top['rps']:,.0f} vs {peer_top['rps']:,.0f})",
                f">= {goal:g}x",
                _verdict(ratio >= goal),
            )
        )
    if "p99_over_best_peer_top" in goals:
        bound = goals["p99_over_best_peer_top"]
        rows.append(
            (
                f"{bench.model} lane p99 at {top} connections vs {best}'s",
                f"{lane_top['p99_ms']:.1f} vs {peer_top['p99_ms']:.1f} ms ({lane_top['p99_ms'] / peer_top['p99_ms']:.2f}x)",
                f"<= {bound:g}x",
                _verdict(served(lane_top) and lane_top["p99_ms"] <= bound * peer_top["p99_ms"]),
            )
        )
    quickest = best_peer(bench, batching, 1, by="p50_ms")
    if quickest is not None and "p50_over_best_peer_ms" in goals:
        lane_one, peer_one = bench.run(LANE, 1), bench.run(quickest, 1)
        over = lane_one["p50_ms"] - peer_one["p50_ms"]
        rows.append(
            (
                f"{bench.model} lane p50 minus the best batching peer's ({quickest}) at 1 connection",
                f"{over:+.2f} ms ({lane_one['p50_ms']:.2f} vs {peer_one['p50_ms']:.2f} ms)",
                f"<= +{goals['p50_over_best_peer_ms']:g} ms",
                _verdict(served(lane_one) and over <= goals["p50_over_best_peer_ms"]),
            )
        )
    return rows


def _verdict(met: bool) -> str:
    return "met" if met else "**missed**"


def field_header(peers: list[Peer], top: int) -> str:
    """The head of the marked `field targets` region of docs/benchmarks.md; each model's region follows it."""
    batching = ", ".join(peer.name for peer in peers if peer.batching)
    return "\n".join(
        [
            "## The field: the lane against the batching peers (`make bench`, the stream sections below)",
            "",
            f"The lane against the best batching peer ({batching}) of the same run: at {top} connections the one with "
            "the most req/s; at 1 connection the one with the lowest p50. Then each system's settings in that run "
            f"(from its sweep) and its server's CPU per request at {top} connections (user + system seconds of its whole "
            "process tree over the requests it answered; the lane and the floor: TorchServe's frontend and workers).",
        ]
    )


def field_model_section(bench: ModelBench, peers: list[Peer], top: int, when: str) -> str:
    """One model's region under the `field targets` head: its field targets, the peers' settings and CPU."""
    batching = {peer.name for peer in peers if peer.batching}
    lines = [
        f"### {bench.model} (`make bench` of {when})",
        "",
        "| target | measured | goal | |",
        "| --- | ---: | ---: | --- |",
        *(f"| {' | '.join(row)} |" for row in field_targets(bench, batching, top)),
        "",
        f"| system | settings | req/s at {top} connections | server CPU ms per request |",
        "| --- | --- | ---: | ---: |",
    ]
    for name in [LANE, *(peer.name for peer in peers)]:
        run = bench.run(name, top)
        lane = bench.lane
        settings = describe(bench.peer_settings.get(name, {})) or (
            f"batchSize {lane.batch_size}, maxBatchDelay {lane.max_batch_delay} ms, {lane.workers} workers"
        )
        cpu = bench.server_cpu_ms.get(name)
        if name in bench.failed:
            rate = "did not run"
        else:
            rate = f"{run['rps']:,.0f} (p50 {run['p50_ms']:.1f}, p99 {run['p99_ms']:.1f} ms)" if served(run) else cell(run)
        lines.append(f"| {name} | {settings} | {rate} | {f'{cpu:.3f}' if cpu else '-'} |")
    if bench.failed:
        lines += ["", "Peers that did not run, with the error:", ""]
        lines += [f"- {name}: `{why[:600]}`" for name, why in bench.failed.items()]
    return "\n".join(lines)
