"""The first seconds after a hot-swap, with and without the new version's warm-up (scripts/swap/hot_swap.py).

    python -m scripts.bench.swap_ramp [--model NAME] [--swaps 4 | --order on off off on] [--runs 4] [--seconds 2]
                                      [--connections 64] [--after-swap]

One TorchServe with the model's lanes, warmed as `make serve` warms it; then swaps back and forth between its
1.0 and 2.0 (model_store/<model>.mar and <model>-2.0.mar: `make archive VERSION=2.0`), the warm-up off and on in
the order off, on, on, off (and so on), each swap running in a thread: the moment the stream lane's set-default
returns, `--runs` back-to-back wrk runs of `--seconds` at `--connections` start on /predictions/<model> (the same
invocation every time), while the swap drains and
unregisters the old version (with --after-swap: once the swap has returned, the old version gone). Printed: each
run's req/s and p99, and the first run's rate as a fraction of the mean of the swap's later runs and of the warm
server's rate before any swap. docs/benchmarks.md ("Warm-up") quotes runs.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from models import registry
from scripts import cli
from scripts.bench import loadgen
from scripts.bench.stream import request_body
from scripts.errors import ScriptError
from scripts.layout import JSON, MODEL_STORE
from scripts.server.temporary import only_lanes_of, serving_in
from scripts.server.warmup import warm_up
from scripts.swap.hot_swap import Swapper, SwapReport

VERSIONS = ("", "-2.0")  # <model>.mar (1.0) and <model>-2.0.mar


def gate_order(swaps: int) -> list[bool]:
    """off, on, on, off, off, on, ...: each setting as often first as second."""
    return [(index % 4) in (1, 2) for index in range(swaps)]


def first_to_later(rates: list[float]) -> float:
    """The first run's rate over the mean of the later runs'."""
    later = rates[1:] or rates
    return rates[0] / (sum(later) / len(later))


def swap_under_load(
    swapper: Swapper,
    model: str,
    mar: Path,
    target: loadgen.Target,
    runs: int,
    seconds: float,
    connections: int,
    after: bool = False,
):
    """Swap `model` to `mar` in a thread; once its stream lane's default moved (`after`: once the swap returned), `runs` wrk
    runs. Returns (report, runs)."""
    moved = threading.Event()
    outcome: dict[str, SwapReport | BaseException] = {}

    def log(line: str) -> None:
        print(f"  {line}", flush=True)
        if line.startswith(f"{model}: default is now"):
            moved.set()

    def swap() -> None:
        try:
            outcome["report"] = swapper.swap(model, mar, record=False)
        except BaseException as error:  # noqa: BLE001 - handed to the main thread
            outcome["error"] = error
        moved.set()

    swapper.log = log
    thread = threading.Thread(target=swap)
    thread.start()
    moved.wait()
    if after:
        thread.join()
    if "error" in outcome:
        raise ScriptError(f"swap to {mar.name} failed: {outcome['error']}")
    results = [loadgen.closed_loop(target, connections, seconds) for _ in range(runs)]
    thread.join()
    if "error" in outcome:
        raise ScriptError(f"swap to {mar.name} failed: {outcome['error']}")
    return outcome["report"], results


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--swaps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--warm-seconds", type=float, default=8.0, help="the swap's warm-up bound when it is on")
    parser.add_argument("--after-swap", action="store_true", help="start the runs once the swap returned")
    parser.add_argument("--order", nargs="*", choices=["on", "off"], help="the warm-up per swap (default: off on on off ...)")
    registry.add_model_option(parser)
    args = parser.parse_args(argv)
    model = registry.model(args.model)
    names = [f"{model.name}{version}.mar" for version in VERSIONS]
    with tempfile.TemporaryDirectory(prefix="swap-ramp-") as folder:
        archives = {name: MODEL_STORE / name for name in names}
        with serving_in(Path(folder), archives, only_lanes_of(names[0])) as server:
            endpoints = server.endpoints
            warmed = warm_up(endpoints, model.lane_names)
            print(f"server warm-up: {sum(w.requests for w in warmed):,} requests", flush=True)
            url, token = endpoints.prediction_url(model.name), endpoints.token("inference")
            target = loadgen.Target(url, request_body(model.name), JSON, token)
            steady = loadgen.closed_loop(target, args.connections, args.seconds)
            print(f"before any swap: {steady.rps:,.0f} req/s, p99 {steady.p99_ms:.1f} ms", flush=True)
            swapper = Swapper(endpoints, server.config, server.model_store)
            rows = []
            order = [word == "on" for word in args.order] if args.order else gate_order(args.swaps)
            for index, gated in enumerate(order):
                swapper.warm_seconds = args.warm_seconds if gated else 0.0
                mar = server.model_store / names[(index + 1) % 2]
                print(f"swap {index + 1} to {mar.name}, warm-up {'on' if gated else 'off'}:", flush=True)
                report, results = swap_under_load(
                    swapper, model.name, mar, target, args.runs, args.seconds, args.connections, args.after_swap
                )
                warm = next((w for w in report.warmups if w.lane == model.name), None)
                rates = [r.rps for r in results]
                line = " | ".join(f"{r.rps:,.0f} req/s, p99 {r.p99_ms:.1f}" for r in results)
                print(
                    f"  runs: {line}; first/later {first_to_later(rates):.2f}, first/before {rates[0] / steady.rps:.2f}"
                    + (f"; {warm.summary()}" if warm else ""),
                    flush=True,
                )
                rows.append((gated, rates, [r.p99_ms for r in results]))
    for gated in (False, True):
        picked = [(rates, p99) for g, rates, p99 in rows if g == gated]
        if picked:
            later = sum(first_to_later(rates) for rates, _ in picked) / len(picked)
            before = sum(rates[0] / steady.rps for rates, _ in picked) / len(picked)
            p99 = sum(p[0] for _, p in picked) / len(picked)
            print(
                f"warm-up {'on ' if gated else 'off'}, mean of {len(picked)} swaps: first run / later runs {later:.2f}, "
                f"first run / before the swap {before:.2f}, first run's p99 {p99:.1f} ms"
            )
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
