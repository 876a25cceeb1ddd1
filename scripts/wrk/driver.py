"""wrk's closed loop: N keep-alive connections, each sending its next request as soon as the last is answered.

    closed_loop(Target(url, body, token=...), connections=64, seconds=8) -> LoadResult

wrk runs as a child process; the result carries the generator's own CPU seconds (from wait4), so a caller can tell
the machine's busy time spent on the server from the time spent on making the load. wrk comes from Debian
(`apt-get install wrk`; the serving image has it too, for its warm-up).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

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


class LoadGenError(ScriptError):
    """The generator (wrk, k6) is missing, failed, or printed no result."""


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


def run_child(command: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> tuple[str, str, float]:
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


def _result(stdout: str) -> dict:
    line = next((line for line in stdout.splitlines() if line.startswith(WRK_MARK)), None)
    if line is None:
        raise LoadGenError(f"wrk printed no result: {stdout[-800:]}")
    return json.loads(line[len(WRK_MARK) :])


def _settle(data: dict, seconds: float, timeout_s: float) -> None:
    """Wait while the server finishes what wrk left in flight when it stopped (its connections close, the server
    answers their requests anyway): about one mean latency of that run, or the run's length if nothing completed
    in it, at most the timeout. Milliseconds for a fast server; seconds for one whose requests queue (an image
    classifier at 64 connections), whose next run would otherwise start behind them."""
    mean_s = data["mean_us"] / 1e6 if data["requests"] else seconds
    if mean_s > 0.05:
        time.sleep(min(mean_s, timeout_s))


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
            warm, _, _ = run_child(base + ["-d", f"{max(1, round(warmup_s))}s", target.url])
            _settle(_result(warm), warmup_s, timeout_s)
        stdout, _, cpu = run_child(base + ["-d", f"{max(1, round(seconds))}s", target.url], timeout=seconds + timeout_s + 30)
    data = _result(stdout)
    _settle(data, seconds, timeout_s)
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
