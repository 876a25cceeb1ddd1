"""A model's stream lane alone and beside a full-speed batch job through the bulk lanes of several variants, in turns.

    python -m scripts.bench.bulk_variants --model digits --variant l0=yield_linger_ms:0 --variant old=/tmp/old/digits.mar
        [--variant cut=yield_between_operators:false]
        [--loads c=1 c=4 c=16 50%] [--repeats 3] [--seconds 5]

One TorchServe serves the model's stream lane and the bulk lane of its default archive ("default"); each --variant is
served by a TorchServe of its own with only its bulk lane: `name=key:value` a copy of the default archive with that
handler setting (scripts/archive/variant.py), `name=path` another archive (for example one built from an earlier
commit). Every bulk worker shares the stream lane's busy signal (one per user and device). At each load the stream
lane runs alone (every job paused, its lane drained), then beside each variant's job in turn, `--repeats` times: the
runs of a comparison are seconds apart on a machine whose speed drifts. Prints each run, then per load the mean p50 /
p99 against alone's and each job's rows/s meanwhile, and each job's rows/s with no traffic.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from functools import partial
from pathlib import Path

from models import registry
from scripts import cli
from scripts.archive.variant import write_variant
from scripts.bench import loadgen
from scripts.bench.beside import JobLoop, job_input, job_rate, lane_capacity, lane_rows, wait_idle
from scripts.bench.stream import request_body
from scripts.layout import JSON, MODEL_STORE
from scripts.server.temporary import only_lanes_of, serving_in
from scripts.swap.management import ManagementApi

JOB_S = 400  # the job's length at the model's rate alone: long enough not to restart during the runs


def variant_archive(model: str, spec: str, folder: Path) -> tuple[str, Path]:
    name, value = spec.split("=", 1)
    if ":" in value and not Path(value).exists():
        key, setting = value.split(":", 1)
        changed = {key: setting_value(setting)}
        return name, write_variant(MODEL_STORE / f"{model}.mar", folder / name / f"{model}.mar", changed)
    return name, Path(value)


def setting_value(text: str) -> bool | int | float:
    """A --variant's value as model-config.yaml would read it: true/false, an integer or a number."""
    if text in ("true", "false"):
        return text == "true"
    number = float(text)
    return int(number) if number.is_integer() else number


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    registry.add_model_option(parser)
    parser.add_argument("--variant", action="append", default=[], help="name=key:value or name=path/to/model.mar")
    parser.add_argument("--loads", nargs="+", default=["c=1", "c=4", "c=16", "50%"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    model = args.model
    with tempfile.TemporaryDirectory(prefix="bulk-variants-") as folder, contextlib.ExitStack() as stack:
        workdir = Path(folder)
        archives = {"default": MODEL_STORE / f"{model}.mar"}
        archives.update(variant_archive(model, spec, workdir) for spec in args.variant)
        source = job_input(model, math.ceil(job_rate(model) * JOB_S), workdir)
        chunk = ["--chunk-size", str(registry.model(model).bench["job"]["chunk_size"])]
        servers = {}
        for index, (name, archive) in enumerate(archives.items()):
            lanes = only_lanes_of(f"{model}.mar") if index == 0 else {"load_models": f"{model}-bulk={model}.mar"}
            served = serving_in(workdir / f"server-{name}", {f"{model}.mar": archive}, lanes, own_session=False)
            servers[name] = stack.enter_context(served)
        endpoints = servers["default"].endpoints
        target = loadgen.Target(endpoints.prediction_url(model), request_body(model), JSON, endpoints.token("inference", 3600))
        capacity = lane_capacity(target, 3, 1)
        jobs, drained = {}, {}
        for name, server in servers.items():
            config = ["--config", str(server.config), "--key-file", str(server.endpoints.key_file)]
            answered = partial(lane_rows, server, f"{model}-bulk")
            jobs[name] = stack.enter_context(JobLoop(model, source, workdir, [*chunk, *config], answered=answered))
            jobs[name].wait_started()
            jobs[name].pause()
            drained[name] = lambda s=server: list(ManagementApi(s.endpoints).worker_pids(f"{model}-bulk"))

        def only(running: str | None) -> None:
            for name, job in jobs.items():
                if name != running:
                    job.pause()
            for name in jobs:
                if name != running:
                    wait_idle(drained[name])
            if running is not None:
                jobs[running].resume()
                time.sleep(0.7)

        results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        for repeat in range(args.repeats):
            for load in args.loads:
                for condition in ["alone", *jobs]:
                    job = jobs.get(condition)
                    only(condition if job else None)
                    rows, started = (job.rows_answered() if job else 0), time.monotonic()
                    if load.startswith("c="):
                        run = loadgen.closed_loop(target, int(load[2:]), args.seconds, warmup_s=0.5)
                    else:
                        run = loadgen.open_loop(target, capacity * int(load.rstrip("%")) / 100, args.seconds)
                    rate = (job.rows_answered() - rows) / (time.monotonic() - started) if job else 0.0
                    results.setdefault((load, condition), []).append((run.p50_ms, run.p99_ms, rate))
                    print(f"{repeat} {load:5} {condition:10} {run.row()}" + (f"  job {rate:,.0f} rows/s" if job else ""))
        alone_rates = {}
        for name, job in jobs.items():
            only(name)
            rows, started = job.rows_answered(), time.monotonic()
            time.sleep(6)
            alone_rates[name] = (job.rows_answered() - rows) / (time.monotonic() - started)
        only(None)
        print(f"{model}, capacity {capacity:,.0f} req/s at 16 connections; mean of {args.repeats} runs:")
        for load in args.loads:
            alone = mean(results[(load, "alone")])
            cells = [f"{load:5} alone {alone[0]:.2f} / {alone[1]:.2f} ms"]
            for name in jobs:
                p50, p99, rate = mean(results[(load, name)])
                cells.append(f"{name}: x{p50 / alone[0]:.2f} / x{p99 / alone[1]:.2f}, job {rate:,.0f} rows/s")
            print(" | ".join(cells))
        print("job alone: " + ", ".join(f"{name} {rate:,.0f} rows/s" for name, rate in alone_rates.items()))
    return 0


def mean(runs: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return tuple(sum(run[i] for run in runs) / len(runs) for i in range(3))  # type: ignore[return-value]


if __name__ == "__main__":
    cli.run(lambda: main())
