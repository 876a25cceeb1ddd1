"""What the front door costs: each stream lane through nginx and straight to TorchServe, side by side in one run.

    python -m scripts.bench.front_door [--seconds 10] [--rounds 3] [--no-report]

One TorchServe with every model's lanes behind its front door (scripts/server/front_door.py). wrk alternates
between the two addresses of the same lane, round after round (so drift on the machine falls on both), at 1
connection (the added p50) and at 64 (the req/s ratio). Writes build/bench/front-door.json and, unless
--no-report, its own section of docs/benchmarks.md (between its markers; the rest of the page is untouched).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from models import registry
from scripts import cli
from scripts.bench.loadgen import Target, closed_loop, wrk_version
from scripts.bench.stream import request_body
from scripts.layout import BUILD, JSON, MODEL_STORE, ROOT
from scripts.server.temporary import only_lanes_of, serving_in

BENCHMARKS = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- bench:front-door:start -->", "<!-- bench:front-door:end -->"
# Goals: what the proxy may add to a lone request's median, and the share of the lanes' rate it must keep.
ADDED_P50_MS_GOAL = 0.1
RPS_RATIO_GOAL = 0.95


def measure(seconds: float, rounds: int, models: list[str]) -> dict:
    archives = {f"{model}.mar": MODEL_STORE / f"{model}.mar" for model in models}
    results: dict = {"tool": wrk_version(), "seconds": seconds, "rounds": rounds, "lanes": {}}
    with tempfile.TemporaryDirectory(prefix="torchserve-front-door-bench-") as folder:
        lanes = ",".join(only_lanes_of(name)["load_models"] for name in archives)
        with serving_in(Path(folder), archives, {"load_models": lanes}, front_door=True) as server:
            door, direct = server.endpoints, server.torchserve_endpoints
            token = door.token("inference")
            for model in models:
                body, kind = request_body(model), JSON  # the stream bench's one-row body (model.yaml bench.request)
                paths = {"front door": door.prediction_url(model), "direct": direct.prediction_url(model)}
                lane: dict = {}
                for connections in (1, 64):
                    runs: dict[str, list] = {name: [] for name in paths}
                    for _ in range(rounds):
                        for name, url in paths.items():
                            result = closed_loop(Target(url, body, kind, token), connections, seconds, warmup_s=1.0)
                            if result.errors:
                                raise SystemExit(f"{model} {name} c={connections}: {result.errors} errors or answers not 2xx")
                            runs[name].append({"rps": result.rps, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms})
                    lane[str(connections)] = {name: _summary(r) for name, r in runs.items()}
                results["lanes"][model] = lane
    return results


def _summary(runs: list[dict]) -> dict:
    return {key: statistics.median(run[key] for run in runs) for key in ("rps", "p50_ms", "p99_ms")} | {"runs": runs}


def verdicts(results: dict) -> list[tuple[str, str, float, bool]]:
    rows = []
    for model, lane in results["lanes"].items():
        added = lane["1"]["front door"]["p50_ms"] - lane["1"]["direct"]["p50_ms"]
        ratio = lane["64"]["front door"]["rps"] / lane["64"]["direct"]["rps"]
        rows.append((model, f"p50 added at 1 connection ≤ {ADDED_P50_MS_GOAL} ms", added, added <= ADDED_P50_MS_GOAL))
        rows.append((model, f"req/s at 64 connections ≥ {RPS_RATIO_GOAL} of direct", ratio, ratio >= RPS_RATIO_GOAL))
    return rows


def section(results: dict) -> str:
    lines = [
        START,
        "## The front door's cost",
        "",
        f"`python -m scripts.bench.front_door` ({results['tool']}, {results['seconds']:g} s a run, medians of "
        f"{results['rounds']} alternated rounds): each stream lane through nginx and straight to TorchServe.",
        "",
        "| lane | connections | front door req/s | direct req/s | front door p50 / p99 ms | direct p50 / p99 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for model, lane in results["lanes"].items():
        for connections, pair in lane.items():
            door, direct = pair["front door"], pair["direct"]
            lines.append(
                f"| {model} | {connections} | {door['rps']:,.0f} | {direct['rps']:,.0f} | "
                f"{door['p50_ms']:.2f} / {door['p99_ms']:.2f} | {direct['p50_ms']:.2f} / {direct['p99_ms']:.2f} |"
            )
    lines += ["", "| lane | goal | measured | |", "| --- | --- | --- | --- |"]
    for model, goal, value, met in verdicts(results):
        shown = f"{value:+.3f} ms" if "ms" in goal else f"{value:.3f}x"
        lines.append(f"| {model} | {goal} | {shown} | {'met' if met else 'missed'} |")
    return "\n".join(lines + [END])


def write_section(text: str, page: Path = BENCHMARKS) -> None:
    """Replace this benchmark's section of `page` (between its markers), or append it; nothing else changes."""
    current = page.read_text() if page.exists() else ""
    if START in current and END in current:
        before, rest = current.split(START, 1)
        after = rest.split(END, 1)[1]
        page.write_text(before + text + after)
    else:
        page.write_text(current.rstrip("\n") + "\n\n" + text + "\n")


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    known = sorted(registry.models())
    parser.add_argument("--models", nargs="+", default=known, choices=known)
    parser.add_argument("--no-report", action="store_true", help="print only; leave docs/benchmarks.md as it is")
    args = parser.parse_args()
    results = measure(args.seconds, args.rounds, args.models)
    BUILD.joinpath("bench").mkdir(parents=True, exist_ok=True)
    (BUILD / "bench" / "front-door.json").write_text(json.dumps(results, indent=2))
    text = section(results)
    print(text)
    if not args.no_report:
        write_section(text)
    return 0


if __name__ == "__main__":
    cli.run(main)
