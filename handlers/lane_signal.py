"""The stream lanes' busy signal, per host and device: a slot per stream worker in a shared-memory file.

A stream worker writes the clock into its slot when a batch starts and the clock negated when it ends; a background
lane on the same device reads the slots between its passes (a few hundred nanoseconds) and cuts its work short while
any is raised, or dropped within its linger (handlers/yielding.py). Slots are claimed with a lock on their bytes,
which the kernel drops when the process ends, so a worker that dies frees its slot for the next one; a slot raised
longer than STALE_S (past any stream lane's response_timeout_s) is read as a worker that died mid-batch, not as
traffic.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch

SLOTS = 64
SLOT_BYTES = 8
ROOT = Path("/dev/shm")
STALE_S = 120.0


def device_name(device: torch.device) -> str:
    """cpu, or cuda<index>: one signal per device the lanes share."""
    return "cpu" if device.type == "cpu" else f"{device.type}{device.index or 0}"


class LaneSignal:
    """The shared slots of one device; `raised()` for a stream worker's batch, `raised_since()` for a bulk lane."""

    def __init__(self, device: str, root: Path = ROOT) -> None:
        self.path = root / f"torchserve-lanes-{os.getuid()}-{device}"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < SLOTS * SLOT_BYTES:
            os.ftruncate(self._fd, SLOTS * SLOT_BYTES)
        self._map = mmap.mmap(self._fd, SLOTS * SLOT_BYTES)
        self._slots = memoryview(self._map).cast("q")
        self.slot: int | None = None

    def claim(self) -> int | None:
        """A free slot for this process (its first free one), None when all are taken: it then raises nothing."""
        for slot in range(SLOTS):
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, SLOT_BYTES, slot * SLOT_BYTES)
            except OSError:
                continue
            self._slots[slot] = 0  # whatever a process that died there left
            self.slot = slot
            return slot
        return None

    @contextlib.contextmanager
    def raised(self) -> Iterator[None]:
        if self.slot is None:
            yield
            return
        self._slots[self.slot] = time.monotonic_ns()
        try:
            yield
        finally:
            self._slots[self.slot] = -time.monotonic_ns()  # dropped, and when: a bulk lane lingers after it

    def raised_since(self, now_ns: int | None = None) -> int:
        """The clock (time.monotonic_ns, the same in every process) at which the oldest raised slot rose; 0: none."""
        now_ns = now_ns if now_ns is not None else time.monotonic_ns()
        fresh = max(0, now_ns - int(STALE_S * 1e9))  # a dropped slot holds a negative clock
        oldest = 0
        for value in self._slots:
            if value > fresh and (oldest == 0 or value < oldest):
                oldest = value
        return oldest

    def dropped_within(self, window_ns: int, now_ns: int | None = None) -> bool:
        """Whether a slot dropped (its batch ended) within the last `window_ns`."""
        since = (now_ns if now_ns is not None else time.monotonic_ns()) - window_ns
        return any(value < 0 and -value >= since for value in self._slots)

    def rises(self, now_ns: int | None = None) -> list[int]:
        """When each raised slot rose (time.monotonic_ns), the stale left out."""
        fresh = max(0, (now_ns if now_ns is not None else time.monotonic_ns()) - int(STALE_S * 1e9))
        return [value for value in self._slots if value > fresh]

    def close(self) -> None:
        self._slots.release()
        self._map.close()
        os.close(self._fd)
