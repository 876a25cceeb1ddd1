"""Start a peer server as a child process in its own session, wait until it answers, always stop it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import requests

from scripts.layout import BUILD, ROOT
from scripts.server.process import stop_process_group, wait_until


@contextlib.contextmanager
def running(command: list[str], health_url: str, env: dict[str, str], timeout: float = 180) -> Iterator[subprocess.Popen]:
    """`command` started from the repository root; yields once GET `health_url` answers 200; stopped on the way out.

    Its output goes to build/bench/<module>.log (a peer logs every client that hangs up, wrk's included)."""
    log_path = BUILD / "bench" / f"{command[2].rsplit('.', 1)[-1]}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, start_new_session=True, stdout=log, stderr=log)
    try:
        wait_until(
            lambda: _healthy(health_url),
            timeout,
            process,
            f"{command[2]} exited with {{code}} before answering {health_url}; see {log_path}",
            lambda: f"{command[2]} did not answer {health_url} within {timeout:.0f}s",
            interval=0.3,
        )
        yield process
    finally:
        stop_process_group(process, timeout=20)


def _healthy(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
