"""Start a peer server as a child process in its own session, wait until it answers, always stop it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import requests

from scripts.errors import ServerError
from scripts.layout import BUILD, ROOT
from scripts.server.process import stop_process_group, wait_until


@contextlib.contextmanager
def running(
    command: list[str], health_url: str, env: dict[str, str], timeout: float = 180, log_name: str | None = None
) -> Iterator[subprocess.Popen]:
    """`command` started from the repository root; yields once GET `health_url` answers 200; stopped on the way out.

    Its output goes to build/bench/<module>.log (a peer logs every client that hangs up, wrk's included)."""
    name = log_name or command[2].rsplit(".", 1)[-1]
    log_path = BUILD / "bench" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, start_new_session=True, stdout=log, stderr=log)
    try:
        try:
            wait_until(
                lambda: _healthy(health_url),
                timeout,
                process,
                f"{name} exited with {{code}} before answering {health_url}; see {log_path}",
                lambda: f"{name} did not answer {health_url} within {timeout:.0f}s; see {log_path}",
                interval=0.3,
            )
        except ServerError as error:
            raise ServerError(f"{error}; its last output: {_tail(log_path)}") from None
        yield process
    finally:
        stop_process_group(process, timeout=20)


def _healthy(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _tail(path, lines: int = 6) -> str:
    """The last lines of a peer's log that say something (its error, usually), joined on one line."""
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    kept = [line.strip() for line in text if line.strip()][-lines:]
    return " | ".join(kept)[-1500:] or "(no output)"
