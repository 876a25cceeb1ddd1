"""A stream lane alone and beside an in-process job at idle priority that yields three ways (docs/priority.md).

    python -m scripts.bench.yield_modes [--model NAME] [--connections 1 4] [--seconds 5]

One TorchServe with the model's lanes; wrk on its stream lane, closed loop, alone, then beside a job (a separate
process at SCHED_IDLE running the model's core over its samples, two passes at once) that ignores the stream lanes'
signal, that calls sched_yield between 1 ms passes while the signal is raised (the CPU path of handlers/yielding.py),
and that pauses while it is raised (its GPU path); then, instead of a job, a bare loop on each CPU at idle priority (no
memory traffic); then alone again. Prints p50 / p99 / req/s and the job's rows/s.
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

MODES = ("alone", "ignores", "sched_yield", "pauses", "spins", "alone")
JOB = """
import sys, time
from handlers.priority import enter_background
enter_background()
from pathlib import Path
from handlers.decoding import Payload
from handlers.lane_signal import LaneSignal
from handlers.yielding import YieldingPasses
from models import registry
from scripts.archive.core import load_core
model, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if mode == "spins":  # no model, no memory: a loop on each CPU, at idle priority
    def spin():
        while True:
            pass
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
    core.yielding = YieldingPasses(LaneSignal("cpu"), full, on_cpu=mode == "sched_yield", pass_s=0.001)
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
    args = parser.parse_args(argv)
    archive = MODEL_STORE / f"{args.model}.mar"
    with tempfile.TemporaryDirectory(prefix="yield-modes-") as folder:
        with serving_in(Path(folder), {archive.name: archive}, only_lanes_of(archive.name)) as server:
            endpoints = server.endpoints
            url = endpoints.prediction_url(args.model)
            target = loadgen.Target(url, request_body(args.model), JSON, endpoints.token("inference"))
            loadgen.closed_loop(target, 4, 3.0)  # warm: the JIT, the workers' first calls
            for connections in args.connections:
                for mode in MODES:
                    job = None
                    if mode != "alone":
                        seconds = str(SETTLE_S + args.seconds + 1)
                        command = [sys.executable, "-c", JOB, args.model, mode, seconds, str(archive)]
                        job = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
                        time.sleep(SETTLE_S)
                    run = loadgen.closed_loop(target, connections, args.seconds)
                    rate = f"; job {job.communicate()[0].strip()} rows/s" if job else ""
                    rate = "; a bare loop on each CPU" if mode == "spins" else rate
                    print(
                        f"c={connections} {mode:11} p50 {run.p50_ms:.2f} p99 {run.p99_ms:.2f} ms, {run.rps:,.0f} req/s, "
                        f"{run.errors} errors{rate}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
