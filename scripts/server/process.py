"""The TorchServe process: start it, wait until its lanes are ready, stop it (`make serve`, tests, benchmarks)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from handlers.priority import GOMP_SPINCOUNT, OMP_WAIT_POLICY, PASSIVE, SPIN_GRACE
from scripts.errors import ConfigError, ServerError
from scripts.layout import ROOT
from scripts.server.endpoints import Endpoints

BIN = Path(sys.executable).parent
# TorchServe's pid file in its $TMPDIR (ts/model_server.py), and the frontend's main class on the java command line.
PID_FILE = ".model_server.pid"
FRONTEND_CLASS = b"org.pytorch.serve.ModelServer"
JAVA_HELP = "java 17 is required: `apt-get install openjdk-17-jre-headless` (Debian/Ubuntu) or set JAVA_HOME"


def check_java() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ConfigError(JAVA_HELP)


def torchserve_command() -> list[str]:
    """The torchserve console script; where ts is only on PYTHONPATH (the GPU serving bundle, scripts/gpu/
    serving_bundle.py) there is none, and the module runs as itself."""
    script = BIN / "torchserve"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ts.model_server"]


def free_ports(names=("inference", "management", "metrics", "grpc_inference", "grpc_management", "workers")) -> dict[str, int]:
    return {name: free_port() for name in names}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A TorchServe started from `workdir` (where it writes key_file.json and logs/)."""

    config: Path
    workdir: Path
    model_store: Path
    # The foreground process (throwaway servers): its process tree is the frontend and every worker.
    process: subprocess.Popen | None = field(default=None, repr=False)
    # nginx before it, where one was started (scripts/server/front_door.py FrontDoor).
    front_door: object | None = field(default=None, repr=False)

    @property
    def endpoints(self) -> Endpoints:
        """Where clients connect (the front door, where the config has one)."""
        return Endpoints.from_config(self.config, self.workdir / "key_file.json")

    @property
    def torchserve_endpoints(self) -> Endpoints:
        """TorchServe's own listeners (behind the front door, where there is one)."""
        return Endpoints.from_config(self.config, self.workdir / "key_file.json", direct=True)

    def start(self, foreground: bool = False, own_session: bool = True) -> subprocess.Popen | None:
        """Foreground: our own child in its own process group (tests). Else TorchServe's daemon mode.
        own_session=False: a process group in the caller's session, whose CPU share the kernel's autogroup then
        shares with it (the beside-a-job bench: its jobs' idle priority is ordered against the lanes only there)."""
        check_java()
        self._clear_pid_file(wait_s=30.0 if foreground else 0.0)
        command = [
            *torchserve_command(),
            "--start",
            "--ncs",
            "--ts-config",
            str(self.config),
            "--model-store",
            str(self.model_store),
        ]
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "TMPDIR": str(self._tmpdir())}
        env.update(worker_environment(env))
        if foreground:
            log = open(self.workdir / "torchserve.out", "wb")
            return subprocess.Popen(
                command + ["--foreground"],
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                **({"start_new_session": True} if own_session else {"process_group": 0}),
            )
        # Daemon mode: the JVM outlives us, so it must not hold our stdout (a pipe would never close).
        (self.workdir / "logs").mkdir(exist_ok=True)
        with open(self.workdir / "logs" / "torchserve.out", "ab") as log:
            subprocess.run(
                command, cwd=self.workdir, env=env, check=True, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        return None

    def _clear_pid_file(self, wait_s: float = 0.0) -> None:
        """TorchServe refuses to start while its pid file names any live process or thread ("TorchServe is already
        running"). A throwaway server's stop() waits for the launcher only, and the JVM it started from this folder
        takes seconds more to exit: the next server started here (make bench-beside's second model, 2026-12-07)
        waits up to `wait_s` for that frontend to be gone. A file left by a killed server whose id was since reused
        (ids are shared by every thread; pid_max is 32,768 here) is dropped unless it names a running frontend."""
        pid_file = self._tmpdir() / PID_FILE
        deadline = time.monotonic() + wait_s
        while True:
            try:
                pid = int(pid_file.read_text().strip())
                status = Path(f"/proc/{pid}/status").read_text()
                frontend = FRONTEND_CLASS in Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                pid_file.unlink(missing_ok=True)
                return
            running = f"\nTgid:\t{pid}\n" in status and frontend and "\nState:\tZ" not in status
            if not running:
                pid_file.unlink(missing_ok=True)
                return
            if time.monotonic() >= deadline:
                return  # a frontend still runs from this folder: TorchServe says so
            time.sleep(0.1)

    def _tmpdir(self) -> Path:
        # TorchServe keeps its pid file in $TMPDIR: one per server, so a test server and `make serve` coexist.
        path = self.workdir / "tmp" if self.workdir != ROOT else Path(os.environ.get("TMPDIR", "/tmp"))
        path.mkdir(parents=True, exist_ok=True)
        return path

    def wait_ready(self, models: list[str], timeout: float = 180.0, process: subprocess.Popen | None = None) -> None:
        pending = list(models)

        def ready() -> bool:
            pending[:] = [model for model in pending if not self._ready(model)]
            return not pending

        wait_until(
            ready,
            timeout,
            process,
            exited=f"TorchServe exited with {{code}}; see {self.workdir / 'torchserve.out'}",
            late=lambda: f"models {pending} not ready after {timeout:.0f}s; see {self.workdir / 'logs'}",
            interval=0.5,
        )

    def _ready(self, model: str) -> bool:
        endpoints = self.torchserve_endpoints
        try:
            reply = requests.get(f"{endpoints.management}/models/{model}", headers=endpoints.auth("management"), timeout=5)
        except (requests.ConnectionError, requests.Timeout, ConfigError):
            return False  # not listening yet, too busy starting to answer, or key_file.json not (fully) written yet
        if reply.status_code != 200:
            return False
        return any(worker.get("status") == "READY" for version in reply.json() for worker in version.get("workers", []))

    def restart(self, models: list[str], timeout: float = 180.0, while_stopped: Callable[[], None] | None = None) -> None:
        """Stop this foreground server and start it again on the same ports, config and model store (it writes
        new tokens into the same key_file.json); returns once `models` are ready. `while_stopped` runs between."""
        if self.process is None:
            raise ServerError("only a server started here in the foreground (a test server) can be restarted")
        stop_process_group(self.process, timeout=30, whole_group=True)
        if while_stopped is not None:
            while_stopped()
        self.process = self.start(foreground=True)
        self.wait_ready(models, timeout, self.process)

    def stop(self, process: subprocess.Popen | None = None) -> None:
        if process is None:
            env = {**os.environ, "TMPDIR": str(self._tmpdir())}
            subprocess.run([str(BIN / "torchserve"), "--stop"], cwd=self.workdir, env=env, check=False)
            return
        # The launcher only: the JVM takes seconds more to exit, which every test's teardown would wait for. A server
        # started from the same folder waits for it instead (_clear_pid_file).
        stop_process_group(process, timeout=30)


def worker_environment(environ: dict[str, str]) -> dict[str, str]:
    """What the workers need in the frontend's environment (it passes its own to each): OpenMP waiting passively after
    a short spin, which libgomp reads when torch loads, before any handler code runs; a stream worker with one torch
    thread has no OpenMP team to wait, so only the bulk lanes' threads change. A value the user set is kept."""
    return {
        OMP_WAIT_POLICY: environ.get(OMP_WAIT_POLICY, PASSIVE),
        GOMP_SPINCOUNT: environ.get(GOMP_SPINCOUNT, SPIN_GRACE),
    }


def wait_until(
    ready: Callable[[], bool],
    timeout: float,
    process: subprocess.Popen | None,
    exited: str,
    late: Callable[[], str],
    interval: float = 0.25,
) -> None:
    """Poll `ready()` until it holds: the one wait for a child that must come up (TorchServe, Prometheus, a
    benchmark peer). ServerError(`exited`, {code} the exit status) when `process` ends first, ServerError(late())
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process is not None and process.poll() is not None:
            raise ServerError(exited.format(code=process.returncode))
        if time.monotonic() > deadline:
            raise ServerError(late())
        time.sleep(interval)


def stop_process_group(process: subprocess.Popen, timeout: float, whole_group: bool = False) -> None:
    """SIGTERM to the session a child was started in (start_new_session=True), SIGKILL after `timeout` s.

    `whole_group`: also wait until every process of the session is gone, not only the child. TorchServe's
    launcher exits at once while its JVM still holds the ports and the pid file a moment longer: a server
    started again on the same ports and folder before then refuses to start ("already running")."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if whole_group:
        _wait_group_gone(process.pid, timeout)


def _wait_group_gone(group: int, timeout: float) -> None:
    """Poll until no process of the session is left; SIGKILL it after `timeout` s, give up 10 s later."""
    deadline, killed = time.monotonic() + timeout, False
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            if killed:
                raise ServerError(f"processes of session {group} are still there {timeout + 10:.0f}s after SIGTERM")
            os.killpg(group, signal.SIGKILL)
            deadline, killed = time.monotonic() + 10, True
        time.sleep(0.1)
