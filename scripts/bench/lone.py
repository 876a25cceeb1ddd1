"""Where a lone request's milliseconds go, on its own (scripts/bench/attribution.py says how it splits them).

    python -m scripts.bench.lone [--seconds 6] [--model NAME]

A TorchServe with this checkout's config.properties, archive and log settings and a no-op lane with the lane's
batching beside it; both warmed (3 s at 64 connections), then one connection for `--seconds` on each.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from models import registry
from scripts import cli
from scripts.bench import loadgen
from scripts.bench.attribution import lone_request, table
from scripts.bench.peers.noop_handler import build_noop_archive
from scripts.bench.stream import lanes_config, request_body
from scripts.layout import JSON, MODEL_STORE
from scripts.server.config import ServerConfig
from scripts.server.temporary import serving_in


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--seconds", type=float, default=6.0)
    registry.add_model_option(parser)
    args = parser.parse_args(argv)
    lane = ServerConfig.read().lane_settings(args.model)[args.model]
    body = request_body(args.model)
    columns = {}
    with tempfile.TemporaryDirectory(prefix="attribution-") as folder:
        noop = build_noop_archive(Path(folder) / "noop")
        archives = {f"{args.model}.mar": MODEL_STORE / f"{args.model}.mar", "noop.mar": noop}
        with serving_in(Path(folder) / "torchserve", archives, lanes_config(args.model, lane)) as server:
            token = server.endpoints.token("inference")
            for name in ("noop", args.model):  # the floor first: it takes the JVM's first compilations
                target = loadgen.Target(server.endpoints.prediction_url(name), body, JSON, token)
                loadgen.closed_loop(target, 64, 3.0)  # warm: the JIT, the workers' first calls
                columns[name] = lone_request(server, name, target, args.seconds).row()
    print(json.dumps(columns, indent=1))
    print("\n".join(table(columns)))
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
