"""A worker's host memory kept near its resting size: glibc's malloc set at start, and freed pages handed back
to the system after a batch that left the worker larger (docs/hardening.md, "Peak memory of a worker").

glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so after a few requests the
blocks of a forward pass or a request body come from the heap instead of mmap: a body that grows past it is
copied as it grows (twice its size for a moment) and what a batch frees stays in the worker (a minilm worker
went from 432 to 502 MiB at rest). A fixed threshold keeps large blocks in mmap, given back when freed; what
the heap keeps in its middle goes back with malloc_trim. Elsewhere (musl, macOS) nothing is changed.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks of at least this size are mmapped, so a freed one leaves at once (the default; a lane may set its own,
# handler.mmap_threshold_mib). Smaller ones, a short text's activations among them, keep reusing the heap: mapping
# each anew would cost page faults on every pass. A bulk lane whose micro-batches allocate blocks of several MiB
# each pass sets a higher one: at 4 MiB the digits core over 512-row passes ran at about half speed.
MMAP_THRESHOLD = 4 * MIB
# With a threshold T, the heap's free top past 2T goes back at each free (glibc's own default is twice its
# dynamic threshold), and a batch that leaves the worker more than T above the size its last trim left is
# followed by malloc_trim (about a millisecond on a minilm worker): smaller growth is left for the next batch to
# reuse (HostMemory.slack). A stream worker must take a max_request_size body (64 MiB) on top of what it holds at
# rest, so little is left to keep. A lane whose every pass needs more than that sets its own slack
# (handler.heap_slack_mib): an image classifier's pass grows a worker by about 30 MiB an image, and a worker that
# trimmed it after each batch faulted it in again, 88 ms an image instead of 43 (docs/models.md). The slack is a
# fixed number, not learnt from the batches: a worker that kept whatever its recent batches grew it by rose by its
# slack again each time (a digits-bulk worker +63 MiB over the ten-minute soak, where a fixed slack holds it flat).
STATM = Path("/proc/self/statm")


class HostMemory:
    """glibc's malloc for one worker process: `settle()` once the model is loaded, `after_batch()` after each."""

    def __init__(self, libc: ctypes.CDLL | None, threshold: int | None = None, slack: int | None = None) -> None:
        self.libc = libc
        self.threshold = threshold  # the mmap threshold set in this process, None where nothing was changed
        self.resting = 0  # bytes of RSS after the last trim: what the worker holds at rest
        self._slack = slack

    @property
    def slack(self) -> int:
        """Growth over the resting size that after_batch() leaves for the next batch: the lane's own, else one
        threshold."""
        return self._slack or self.threshold or MMAP_THRESHOLD

    @classmethod
    def for_this_process(cls, threshold: int | None = None, slack: int | None = None) -> HostMemory:
        """Tunes glibc's malloc when this process runs on it (blocks of `threshold` bytes and more mapped; None:
        MMAP_THRESHOLD; `slack` bytes of growth left in place after a batch, None: one threshold); a HostMemory
        that changes nothing otherwise."""
        threshold = threshold or MMAP_THRESHOLD
        libc = _glibc()
        if libc is None:
            logger.info("not on glibc: malloc left as it is")
            return cls(None)
        if not (libc.mallopt(M_MMAP_THRESHOLD, threshold) and libc.mallopt(M_TRIM_THRESHOLD, 2 * threshold)):
            logger.warning("mallopt refused the thresholds: malloc left as it is")
            return cls(libc)
        return cls(libc, threshold, slack)

    def settle(self) -> int:
        """Hand back what loading freed and take the resting size; returns it in bytes (0 where unknown)."""
        self._trim()
        self.resting = rss_bytes()
        return self.resting

    def after_batch(self) -> bool:
        """Trim when the batch left the worker more than its slack above its resting size; whether it did. What
        a trim cannot give back (code pages a first forward pass touched, objects kept) becomes the resting size."""
        if self.libc is None or rss_bytes() <= self.resting + self.slack:
            return False
        self.settle()
        return True

    def _trim(self) -> None:
        if self.libc is not None:
            self.libc.malloc_trim(0)


class _Statm:
    """/proc/self/statm kept open: after_batch() reads it once per batch, and a pread of the open file costs
    about 1 µs where opening it each time cost 10 (timeit, this machine). The kernel regenerates the file on
    each read from offset 0."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.pid = 0  # the process that opened it: a forked child opens its own
        self.page = os.sysconf("SC_PAGE_SIZE")

    def rss_bytes(self) -> int:
        try:
            if self.fd is None or self.pid != os.getpid():
                self.fd, self.pid = os.open(STATM, os.O_RDONLY | os.O_CLOEXEC), os.getpid()
            return int(os.pread(self.fd, 128, 0).split()[1]) * self.page
        except (OSError, IndexError, ValueError):
            return 0


_STATM = _Statm()


def rss_bytes() -> int:
    """This process's resident set size from /proc (0 where there is none)."""
    return _STATM.rss_bytes()


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc
