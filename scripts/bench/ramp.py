"""A fresh server's first runs: req/s of back-to-back closed-loop runs on a model's stream lane, from start-up.

    python -m scripts.bench.ramp [--model NAME] [--runs 6] [--seconds 5] [--warm]

Without --warm the first run starts as soon as the lanes are ready; with --warm after `make serve`'s warm-up
(scripts/server/warmup.py). docs/benchmarks.md ("Warm-up") shows both.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from models import registry
from scripts import cli
from scripts.bench import loadgen
from scripts.bench.stream import request_body
from scripts.layout import JSON, MODEL_STORE
from scripts.server.temporary import only_lanes_of, serving_in
from scripts.server.warmup import warm_up


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--warm", action="store_true", help="warm up as `make serve` does before the first run")
    registry.add_model_option(parser)
    args = parser.parse_args(argv)
    model = registry.model(args.model)
    with tempfile.TemporaryDirectory(prefix="ramp-") as folder:
        archive = f"{model.name}.mar"
        with serving_in(Path(folder), {archive: MODEL_STORE / archive}, only_lanes_of(archive)) as server:
            endpoints = server.endpoints
            if args.warm:
                started = time.monotonic()
                warmed = warm_up(endpoints, model.lane_names)
                print(f"warm-up: {sum(w.requests for w in warmed):,} requests in {time.monotonic() - started:.1f}s")
                for lane in warmed:
                    print(f"  {lane.lane}: {lane.requests:,} requests in {lane.seconds:.1f}s, {lane.failed} failed")
            target = loadgen.Target(
                endpoints.prediction_url(model.name), request_body(model.name), JSON, endpoints.token("inference")
            )
            for index in range(args.runs):
                run = loadgen.closed_loop(target, args.connections, args.seconds)
                print(f"run {index + 1}: {run.rps:,.0f} req/s, p50 {run.p50_ms:.1f} ms, p99 {run.p99_ms:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
