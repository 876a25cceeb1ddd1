"""A lane served with its archive as built and with some handler settings or the handler code changed, side by side.

    python -m scripts.bench.ab --set fast_protocol=false [--model NAME] [--connections 1 4 64] [--rounds 3]
    python -m scripts.bench.ab --code-from HEAD~1     # B: the same archive with the handler code of a git revision

Both lanes get the stream lane's batching from config.properties; they take turns under wrk at each connection
count after both were warmed (3 s at 64 connections), A first in odd rounds and B first in even ones, so drift
on a noisy box hits both. Prints req/s and p50 per round and the median ratio B/A. Used for the measurements
behind handler settings and code changes (e.g. docs/benchmarks.md, Tuning).
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import zipfile
from pathlib import Path

import yaml

from models import registry
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.archive.variant import write_variant
from scripts.bench import loadgen
from scripts.bench.stream import lane_entry, request_body, served_lanes
from scripts.errors import ScriptError
from scripts.layout import JSON, MODEL_STORE, ROOT
from scripts.server.config import ServerConfig
from scripts.server.temporary import serving_in


def lanes(model: str) -> dict[str, str]:
    """Lanes A (the archive as built) and B (its variant), both with the stream lane's batching."""
    lane = ServerConfig.read().lane_settings(model)[model]
    return served_lanes(
        {"A": lane_entry(f"{model}.mar", lane, lane.batch_size), "B": lane_entry(f"{model}-b.mar", lane, lane.batch_size)}
    )


def with_code_from(archive: Path, revision: str) -> Path:
    """`archive` rewritten in place with the handler code of a git `revision`: its handlers/ package as it was
    then (modules added since are left out) and its torchserve_handler.py as the entry point."""

    def git(*args: str) -> bytes:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True)
        if done.returncode != 0:
            raise ScriptError(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
        return done.stdout

    listed = git("ls-tree", "-r", "--name-only", revision, "handlers/").decode().split()
    sources = [path for path in listed if path.endswith(".py")]
    temporary = archive.with_name(archive.name + ".code")
    with zipfile.ZipFile(archive) as old, zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as new:
        for entry in old.infolist():
            if entry.filename.startswith("handlers/"):
                continue
            if entry.filename == "torchserve_handler.py":
                new.writestr(entry, git("show", f"{revision}:handlers/torchserve/torchserve_handler.py"))
            else:
                new.writestr(entry, old.read(entry))
        for source in sources:
            new.writestr(source, git("show", f"{revision}:{source}"))
    temporary.replace(archive)
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    registry.add_model_option(parser)
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=YAML", help="handler settings of lane B")
    parser.add_argument("--code-from", metavar="REV", help="lane B runs the handler code of this git revision")
    parser.add_argument("--connections", nargs="+", type=int, default=[1, 4, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    changed = {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.set)}
    if not changed and not args.code_from:
        parser.error("say what lane B changes: --set and/or --code-from")
    body = request_body(args.model)
    with tempfile.TemporaryDirectory(prefix="ab-") as folder:
        variant = write_variant(MODEL_STORE / f"{args.model}.mar", Path(folder) / f"{args.model}-b.mar", changed)
        if args.code_from:
            MarFile(with_code_from(variant, args.code_from)).record_digest()
        archives = {f"{args.model}.mar": MODEL_STORE / f"{args.model}.mar", f"{args.model}-b.mar": variant}
        with serving_in(Path(folder) / "torchserve", archives, lanes(args.model)) as server:
            token = server.endpoints.token("inference")
            targets = {name: loadgen.Target(server.endpoints.prediction_url(name), body, JSON, token) for name in "AB"}
            for target in targets.values():
                loadgen.closed_loop(target, 64, 3.0)
            code = f", handler code of {args.code_from}" if args.code_from else ""
            print(f"A: {args.model}.mar as built; B: settings {changed}{code}")
            print("| connections | round | A req/s | B req/s | A p50 ms | B p50 ms |")
            print("| ---: | ---: | ---: | ---: | ---: | ---: |")
            for connections in args.connections:
                ratios = []
                for round_ in range(args.rounds):
                    # A first in odd rounds, B first in even ones: drift on the box favours neither.
                    order = "AB" if round_ % 2 == 0 else "BA"
                    runs = {name: loadgen.closed_loop(targets[name], connections, args.seconds) for name in order}
                    a, b = runs["A"], runs["B"]
                    if not a.rps or not b.rps:
                        raise ScriptError(f"a lane answered nothing at {connections} connections: A {a.rps:.0f}, B {b.rps:.0f}")
                    ratios.append(b.rps / a.rps)
                    print(
                        f"| {connections} | {round_ + 1} | {a.rps:,.0f} | {b.rps:,.0f} | {a.p50_ms:.2f} | {b.p50_ms:.2f} |",
                        flush=True,
                    )
                print(f"| {connections} | median B/A | {statistics.median(ratios):.2f}x | | | |", flush=True)
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
