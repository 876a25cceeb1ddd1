"""The image's command (under tini, PID 1): TorchServe in the foreground, stopped cleanly on SIGTERM or SIGINT.

tini hands `docker stop`'s SIGTERM to this process only. TorchServe's own `torchserve --start --foreground`
is a Python wrapper around the Java frontend: sent the signal itself, it would die at once and leave the
frontend to be killed outright when the container ends. Instead this asks TorchServe to stop
(`torchserve --stop --foreground`: SIGTERM to the frontend, whose shutdown hook stops the workers, and a
wait for it), then exits 0. A TorchServe that ends without being asked is an error (exit 1), so a restart
policy sees it.

TorchServe runs in `--key-dir`, where it writes key_file.json (the tokens); a stop removes it there.

Ready means warm: a thread beside TorchServe waits until every lane has a READY worker, warms every lane as
`make serve` does and then writes `<key dir>/warmed-up.json`, which `healthcheck --ready` (the image's HEALTHCHECK,
the pod's start-up and readiness probes) waits for (scripts/container/warm.py). A stale marker is removed first.

Before TorchServe starts, every archive the config loads (load_models) must match the sha256 recorded next to it
(`<archive>.sha256`, written by `make archive` where the archives were built and tested): a changed or unrecorded
archive stops the start with a message naming it, and the container exits 1.

    python -m scripts.container.entrypoint --ts-config config.container.properties --key-dir /keys
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil

from scripts import cli
from scripts.container.config import CONTAINER_CONFIG, KEY_DIR
from scripts.container.warm import marker, warm_when_ready
from scripts.errors import ServerError
from scripts.server.config import ServerConfig
from scripts.server.front_door import FrontDoor, front_door_addresses
from scripts.server.process import BIN, check_java, stop_process_group, worker_environment
from scripts.server.serve import verify_loaded_archives

# How long a stop may take before its leftovers are killed; under `podman stop`'s and Kubernetes' 30 s default.
STOP_TIMEOUT_S = 25.0
POLL_S = 0.2


class StopRequest:
    """Set by SIGTERM/SIGINT; the main loop polls it (a signal handler only records, it does no work)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: object) -> None:
        self.signal = signum


def torchserve(*args: str) -> list[str]:
    return [str(BIN / "torchserve"), *args]


def serve(config: Path, key_dir: Path, stop_timeout: float = STOP_TIMEOUT_S) -> int:
    check_java()
    server_config = ServerConfig.read(config)
    store = server_config.model_store
    checked = verify_loaded_archives(server_config, store)
    print(f"archives match their recorded sha256: {', '.join(checked) or 'none loaded'}", flush=True)
    stop = StopRequest()
    marker(key_dir / "key_file.json").unlink(missing_ok=True)  # ready only once this run has warmed its lanes
    # A session of its own: a terminal's Ctrl-C reaches only this process, which then stops TorchServe in order.
    process = subprocess.Popen(
        torchserve("--start", "--foreground", "--ncs", "--ts-config", str(config), "--model-store", str(store)),
        cwd=key_dir,
        env={**os.environ, **worker_environment(dict(os.environ))},
        start_new_session=True,
    )
    door = None
    if front_door_addresses(server_config, os.environ):
        # Clients reach TorchServe only through nginx (docs/front-door.md); its files go to a folder of its own.
        door = FrontDoor(config, Path(tempfile.mkdtemp(prefix="front-door-")))
        door.start()
        print(
            f"front door (nginx) listening on {', '.join(front_door_addresses(server_config, os.environ).values())}", flush=True
        )
    stopping = threading.Event()
    warming = threading.Thread(target=warm_when_ready, args=(config, key_dir / "key_file.json", stopping), daemon=True)
    warming.start()
    while process.poll() is None and stop.signal is None and (door is None or door.running()):
        time.sleep(POLL_S)
    stopping.set()
    if door is not None and not door.running() and stop.signal is None:
        stop_torchserve(process, key_dir, stop_timeout)
        raise ServerError(f"the front door (nginx) exited on its own; see {door.folder / 'nginx.out'}")
    if door is not None:
        door.stop()  # no new requests; those in flight are answered first (nginx's graceful quit)
    if stop.signal is None:
        stop_process_group(process, timeout=stop_timeout)  # the frontend's workers, if any are left
        raise ServerError(f"TorchServe exited on its own (status {process.returncode}); its log is above")
    print(f"{signal.Signals(stop.signal).name}: stopping TorchServe", flush=True)
    return stop_torchserve(process, key_dir, stop_timeout)


def stop_torchserve(process: subprocess.Popen, key_dir: Path, timeout: float) -> int:
    started = time.monotonic()
    try:
        subprocess.run(torchserve("--stop", "--foreground"), cwd=key_dir, timeout=timeout, check=False)
        process.wait(timeout=max(timeout - (time.monotonic() - started), 1.0))
    except subprocess.TimeoutExpired:
        stop_process_group(process, timeout=1.0)
        raise ServerError(f"TorchServe did not stop within {timeout:.0f}s; killed") from None
    frontend_s = time.monotonic() - started
    leftovers = _workers_left(process.pid, deadline=started + timeout)
    if leftovers:
        raise ServerError(f"TorchServe stopped but {leftovers} of its processes did not within {timeout:.0f}s; killed")
    print(f"TorchServe stopped: frontend in {frontend_s:.1f}s, workers in {time.monotonic() - started:.1f}s", flush=True)
    return 0


def _workers_left(group: int, deadline: float) -> int:
    """Waits for the workers of TorchServe's session: each exits on its own once the frontend has closed its
    socket. Those still running at `deadline` are killed and counted."""
    while True:
        alive = _alive(group)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    for process in alive:
        print(f"killing {process.pid}: {' '.join(process.cmdline())}", flush=True)
        with contextlib.suppress(psutil.Error):
            process.kill()
    return len(alive)


def _alive(group: int) -> list[psutil.Process]:
    """The processes of `group` still running (exited ones wait as zombies until tini reaps them)."""
    alive = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(process.pid) == group and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--ts-config", type=Path, default=CONTAINER_CONFIG, help="config.properties for TorchServe")
    parser.add_argument("--key-dir", type=Path, default=KEY_DIR, help="where TorchServe runs and writes key_file.json")
    parser.add_argument("--stop-timeout", type=float, default=STOP_TIMEOUT_S, help="seconds a stop may take")
    args = parser.parse_args(argv)
    return serve(args.ts_config.resolve(), args.key_dir, args.stop_timeout)


if __name__ == "__main__":
    cli.run(lambda: main())
