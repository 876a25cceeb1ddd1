"""A lane's own time limit per batch (handler.response_timeout_s): the worker ends itself when a batch runs past it.

TorchServe 0.12 takes responseTimeout from the archive's model-config.yaml for every lane registered from it, so
the stream lane would wait as long for a hung request as a bulk chunk may take. A watch thread of the worker
compares the running batch's age with the lane's limit; past it, the worker logs why and exits, and TorchServe
answers every request of that batch 500 "Worker died." at once and starts another worker, as it does itself
when responseTimeout runs out. The thread looks twice a second, so the error comes within the limit plus 0.5 s.
"""

from __future__ import annotations

import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

POLL_S = 0.5
# The worker's exit status when it ends a batch that ran too long (TorchServe's answer is 500 for any status
# but 137, which it reports as 507, out of resources).
EXIT_STATUS = 3


class LaneTimeout:
    """Started once per worker; `running()` marks a batch's start, `done()` its end."""

    def __init__(self, lane: str, timeout_s: float, poll_s: float = POLL_S) -> None:
        self.lane = lane
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._started: float | None = None
        self._requests = 0
        self._thread = threading.Thread(target=self._watch, name=f"{lane}-timeout", daemon=True)
        self._thread.start()

    def running(self, requests: int) -> None:
        self._requests = requests
        self._started = time.monotonic()

    def done(self) -> None:
        self._started = None

    def overdue(self, now: float) -> bool:
        started = self._started
        return started is not None and now - started > self.timeout_s

    def _watch(self) -> None:
        while True:
            time.sleep(self.poll_s)
            if self.overdue(time.monotonic()):
                self._expire()

    def _expire(self) -> None:
        logger.error(
            "lane %s: a batch of %d request(s) ran past handler.response_timeout_s=%s s; ending this worker "
            "so TorchServe answers them 500 and starts another",
            self.lane,
            self._requests,
            self.timeout_s,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_STATUS)
