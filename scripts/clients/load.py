"""One driver for concurrent single requests from Python threads: correctness checks (verify, tests) that
need TorchServe to batch requests from many clients. Speed is measured with wrk instead (scripts/bench/):
on 2 cores a Python thread pool is itself the bottleneck."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import requests

from handlers.headers import BATCH_REQUESTS, REPORT_WORKER_PID, WORKER_PID
from scripts.clients.rest import predict
from scripts.server.endpoints import Endpoints


@dataclass(frozen=True)
class Answer:
    """One request's reply and how long it took, from send to the last byte."""

    reply: requests.Response
    latency_ms: float

    @property
    def batch_requests(self) -> int:
        """How many requests the handler saw in the call that answered this one (X-Batch-Requests)."""
        return int(self.reply.headers.get(BATCH_REQUESTS, 1))

    @property
    def worker_pid(self) -> int | None:
        """The process id of the TorchServe worker that answered (X-Worker-Pid), None if not named."""
        pid = self.reply.headers.get(WORKER_PID)
        return int(pid) if pid else None


# Every request sent here asks for the answering worker's pid (Answer.worker_pid: the hot-swap's drain, tests).
ASK_PID = {REPORT_WORKER_PID: "1"}


def send_concurrently(
    endpoints: Endpoints,
    lane: str,
    bodies: Sequence[bytes],
    kinds: Sequence[str],
    clients: int,
    timeout: float = 60,
    version: str | None = None,
) -> list[Answer]:
    """Every body POSTed once to `lane`, by `clients` threads (keep-alive sessions) released together.

    `kinds` gives each body's content type. Answers come back in the order of `bodies`; with as many
    clients as bodies, every request is in flight at once, so TorchServe can batch them.
    """
    if len(kinds) != len(bodies):
        raise ValueError(f"{len(bodies)} bodies but {len(kinds)} content types")
    answers: list[Answer | None] = [None] * len(bodies)
    threads = max(1, min(clients, len(bodies)))
    start = threading.Barrier(threads)
    indices = iter(range(len(bodies)))
    lock = threading.Lock()
    failures: list[BaseException] = []

    def client() -> None:
        session = requests.Session()
        start.wait()
        while True:
            with lock:
                index = next(indices, None)
            if index is None or failures:
                return
            sent = time.perf_counter()
            try:
                reply = predict(
                    endpoints, lane, bodies[index], kinds[index], version, timeout=timeout, session=session, headers=ASK_PID
                )
            except requests.RequestException as error:
                failures.append(error)
                return
            answers[index] = Answer(reply, (time.perf_counter() - sent) * 1000)

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]
    return answers  # type: ignore[return-value]
