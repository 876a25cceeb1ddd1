"""A stream lane alone and beside an in-process job at idle priority that yields in several ways (docs/priority.md).

    python -m scripts.bench.yield_modes [--model NAME] [--connections 1 4] [--seconds 5] [--repeats 3]

One TorchServe with the model's lanes; wrk on its stream lane, closed loop, alone, then beside a job (a separate
process at SCHED_IDLE running the model's core over its samples, two passes at once) that ignores the stream lanes'
signal, that calls sched_yield between 1 ms passes while the signal is raised (the CPU path of handlers/yielding.py),
that also keeps them short for 20 ms after it drops (yield_linger_ms), and that pauses while it is raised (the GPU
path); then, instead of a job, a bare loop on each CPU at idle priority (no memory traffic), and the same loop calling
sched_yield every 0.7 ms. The modes take turns `--repeats` times; prints each run, then each mode's mean p50 / p99
against alone's and the job's rows/s.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from models import registry
from scripts import cli
from scripts.bench import loadgen
from scripts.bench.stream import request_body
from scripts.layout import JSON, MODEL_STORE, ROOT
from scripts.server.temporary import only_lanes_of, serving_in

MODES = ("alone", "ignores", "sched_yield", "lingers", "pauses", "spins", "spins yielding")
JOB = """
import os, sys, time
from handlers.priority import enter_background
enter_background()
from pathlib import Path
from handlers.decoding import Payload
from handlers.lane_signal import LaneSignal
from handlers.yielding import YieldingPasses
from models import registry
from scripts.archive.core import load_core
model, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if mode.startswith("spins"):  # no model, no memory: a loop on each CPU, at idle priority
    def spin():
        while True:
            for _ in range(30_000):  # about 0.7 ms
                pass
            if mode == "spins yielding":
                os.sched_yield()
    import multiprocessing
    others = [multiprocessing.Process(target=spin, daemon=True) for _ in range(2)]
    for other in others:
        other.start()
    time.sleep(seconds)
    print("0")
    sys.exit(0)
core = load_core(Path(sys.argv[4]))
core.run_passes_at_once(2)
if mode != "ignores":
    full = core.settings.max_batch_rows * 2
    on_cpu, linger_s = mode in ("sched_yield", "lingers"), 0.02 if mode == "lingers" else 0.0
    core.yielding = YieldingPasses(LaneSignal("cpu"), full, on_cpu=on_cpu, pass_s=0.001, linger_s=linger_s)
rows = core.decode(Payload(registry.model(model).samples().request(core.settings.max_batch_rows * 8), raw=False))
done, started = 0, time.monotonic()
while time.monotonic() - started < seconds:
    core.predict(rows)
    done += len(rows)
print(f"{done / (time.monotonic() - started):,.0f}")
"""
SETTLE_S = 3.0  # the job's start-up and first passes, before wrk starts


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    registry.add_model_option(parser)
    parser.add_argument("--connections", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3, help="times the modes take turns")
    args = parser.parse_args(argv)
    archive = MODEL_STORE / f"{args.model}.mar"
    with tempfile.TemporaryDirectory(prefix="yield-modes-") as folder:
        with serving_in(Path(folder), {archive.name: archive}, only_lanes_of(archive.name)) as server:
            endpoints = server.endpoints
            url = endpoints.prediction_url(args.model)
            target = loadgen.Target(url, request_body(args.model), JSON, endpoints.token("inference"))
            loadgen.closed_loop(target, 4, 3.0)  # warm: the JIT, the workers' first calls
            runs: dict[tuple[int, str], list[tuple[float, float, str]]] = {}
            for repeat in range(args.repeats):
                for connections in args.connections:
                    for mode in MODES:
                        job = None
                        if mode != "alone":
                            seconds = str(SETTLE_S + args.seconds + 1)
                            command = [sys.executable, "-c", JOB, args.model, mode, seconds, str(archive)]
                            job = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
                            time.sleep(SETTLE_S)
                        run = loadgen.closed_loop(target, connections, args.seconds)
                        rate = job.communicate()[0].strip() if job else ""
                        runs.setdefault((connections, mode), []).append((run.p50_ms, run.p99_ms, rate))
                        print(
                            f"{repeat} c={connections} {mode:14} p50 {run.p50_ms:.2f} p99 {run.p99_ms:.2f} ms, "
                            f"{run.rps:,.0f} req/s, {run.errors} errors" + (f"; job {rate} rows/s" if job else ""),
                            flush=True,
                        )
            print("mean of the runs, p50 / p99 ms (x alone's):")
            for connections in args.connections:
                alone = _means(runs[(connections, "alone")])
                for mode in MODES:
                    p50, p99 = _means(runs[(connections, mode)])
                    rates = [rate for _, _, rate in runs[(connections, mode)] if rate and rate != "0"]
                    job = f"; job {', '.join(rates)} rows/s" if rates else ""
                    print(f"c={connections} {mode:14} {p50:.2f} / {p99:.2f} (x{p50 / alone[0]:.2f} / x{p99 / alone[1]:.2f}){job}")
    return 0


def _means(runs: list[tuple[float, float, str]]) -> tuple[float, float]:
    return sum(r[0] for r in runs) / len(runs), sum(r[1] for r in runs) / len(runs)


if __name__ == "__main__":
    cli.run(lambda: main())
