"""One chunk of rows -> one RowResult per row: retries for failures of the server, isolation for bad rows.

- No answer (connection refused or reset: a server restarting), a 5xx (queue full 503, a worker that died
  500, or TorchServe's 507 "Worker died." when it was SIGKILLed), 408 or 429: the same chunk again after a
  backoff, for up to RetryPolicy.patience seconds from its first failure, then a JobError (the job is resumable).
- A 4xx, or the handler's 507, whose message starts `instances[<i>]: ` (the handler names the first row it
  could not decode, or a row that does not fit in device memory even alone): that row gets the error, the rest
  of the chunk is sent again without it.
- Any other 4xx or 507: the chunk is halved until the rows that fail on their own are found.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scripts.jobs.inputs import Row
from scripts.jobs.outputs import RowResult
from scripts.jobs.runners import JobError, Reply, TransientError

Send = Callable[[list[Any]], Reply]
ROW_ERROR = re.compile(r"instances\[(\d+)\]: (.*)", re.DOTALL)
OUT_OF_RESOURCES = 507
# About the request, not its rows (bad token, no such lane): splitting the chunk would not help.
JOB_STATUSES = {
    401: "check the token (key_file.json)",
    403: "check the token (key_file.json)",
    404: "is the model registered under that lane?",
    405: "is the address an inference API?",
}
# Worth another try like a 5xx: the server is busy or slow, the rows may be fine.
BUSY_STATUSES = {408, 429}
# TorchServe's answer for the requests of a worker that died mid-batch: 500, or 507 when the worker exited
# with status 137 (SIGKILL, what the kernel's OOM killer sends). The handler's own 507 says otherwise.
WORKER_DIED = "Worker died."


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of a chunk the server failed: exponential backoff with jitter, until `patience` seconds have
    passed since the chunk's first failure (or after `attempts` tries, when set); then the job stops.

    The default patience outlasts a TorchServe restart: 89 s to 116 s from stop to ready lanes on this
    project's 2-core machine while other jobs kept it busy (load average 15-24; docs/hardening.md, Faults)."""

    patience: float = 300.0
    first_delay: float = 0.5
    max_delay: float = 10.0
    attempts: int | None = None
    # Told each retry as one line ("rows 1..20: HTTP 503: queue full (job_queue_size=6); try 2 in 0.8s"); the command
    # prints it, tests count them.
    notify: Callable[[str], None] | None = None

    def delay(self, attempt: int) -> float:
        # Exponential with jitter, so concurrent chunks that failed together do not retry in lockstep.
        return min(self.max_delay, self.first_delay * 2**attempt) * random.uniform(0.5, 1.0)

    def exhausted(self, tries: int, waited: float) -> bool:
        return waited >= self.patience or (self.attempts is not None and tries >= self.attempts)


def run_chunk(send: Send, rows: list[Row], retry: RetryPolicy) -> list[RowResult]:
    """Results for every row of the chunk, in the chunk's order."""
    results = {row.index: _unreadable(row) for row in rows if row.problem is not None}
    readable = [row for row in rows if row.problem is None]
    pending = [readable] if readable else []
    while pending:
        part = pending.pop()
        reply = send_with_retry(send, part, retry)
        if reply.status == 200:
            results.update(_predictions(part, reply.body))
            continue
        located = _located_row(reply, len(part))
        if located is not None:
            position, message = located
            results[part[position].index] = _failed(part[position], reply, message)
            rest = part[:position] + part[position + 1 :]
            if rest:
                pending.append(rest)
        elif len(part) == 1:
            results[part[0].index] = _failed(part[0], reply, _message(reply))
        else:
            middle = len(part) // 2
            pending += [part[middle:], part[:middle]]
    return [results[row.index] for row in rows]


def send_with_retry(send: Send, rows: list[Row], retry: RetryPolicy) -> Reply:
    span = f"rows {rows[0].index + 1}..{rows[-1].index + 1}"
    first_failure: float | None = None
    tries = 0
    while True:
        tries += 1
        try:
            reply = send([row.instance for row in rows])
        except TransientError as error:
            last = str(error)
        else:
            if reply.status in JOB_STATUSES:
                raise JobError(f"HTTP {reply.status} for a chunk: {_message(reply)} ({JOB_STATUSES[reply.status]})")
            if not _server_failed(reply):
                return reply
            last = f"HTTP {reply.status}: {_message(reply)}"
        now = time.monotonic()
        first_failure = now if first_failure is None else first_failure
        if retry.exhausted(tries, now - first_failure):
            raise JobError(
                f"{span} failed {tries} times in {now - first_failure:.0f}s (retried for up to {retry.patience:.0f}s), "
                f"last with {last}; the rows before them are saved: fix the cause and rerun with --resume"
            )
        delay = retry.delay(tries - 1)
        if retry.notify is not None:
            retry.notify(f"{span}: {last}; try {tries + 1} in {delay:.1f}s")
        time.sleep(delay)


def _server_failed(reply: Reply) -> bool:
    """A failure of the server, not of the rows: the same chunk may well succeed later."""
    if reply.status == OUT_OF_RESOURCES:
        return _message(reply) == WORKER_DIED
    return reply.status >= 500 or reply.status in BUSY_STATUSES


def _predictions(rows: list[Row], body: Any) -> dict[int, RowResult]:
    predictions = body.get("predictions") if isinstance(body, dict) else None
    if not isinstance(predictions, list) or len(predictions) != len(rows):
        count = len(predictions) if isinstance(predictions, list) else "no"
        raise JobError(f"the server answered {count} predictions for {len(rows)} rows; expected exactly one per row")
    return {row.index: RowResult(row, prediction=p) for row, p in zip(rows, predictions, strict=True)}


def _located_row(reply: Reply, size: int) -> tuple[int, str] | None:
    if not (400 <= reply.status < 500 or reply.status == OUT_OF_RESOURCES):
        return None
    match = ROW_ERROR.match(_message(reply))
    if match is None or int(match.group(1)) >= size:
        return None
    return int(match.group(1)), match.group(2)


def _message(reply: Reply) -> str:
    if isinstance(reply.body, dict) and "message" in reply.body:
        return str(reply.body["message"])
    return str(reply.body)[:500]


def _failed(row: Row, reply: Reply, message: str) -> RowResult:
    # The message is stripped of its position in the chunk: the error line carries the input row instead.
    kind = reply.body.get("type", "InvalidInput") if isinstance(reply.body, dict) else "InvalidInput"
    return RowResult(row, error={"code": reply.status, "type": kind, "message": message})


def _unreadable(row: Row) -> RowResult:
    return RowResult(row, error={"code": 400, "type": "UnreadableRow", "message": row.problem})
