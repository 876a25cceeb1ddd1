"""Python's cyclic garbage collector paced by units of work (a batch, a chunk) instead of by allocations.

By default CPython runs a collection every 700 container allocations and, every so often, a full one over every
tracked object. A batch job or a bulk batch allocates a list and a dict or two per row, and the rows of the chunks
in flight live long enough to be scanned again by each young collection and promoted into the older ones; with
torch, the exported program and their imports in the process (hundreds of thousands of tracked objects), a full
collection takes a tenth of a second, paid again and again by a job (docs/decisions.md gives the figures).

`PacedCollector` freezes what the process holds when the work starts (the model and its imports: never garbage,
never scanned again), turns automatic collection off, and collects at the boundaries the caller marks with
`tick()`: the young generation at every tick, so a cycle made during a batch (an exception kept with its
traceback, which holds the frame that held the request's body) is freed when the batch ends, and everything not
frozen every `full_every` ticks. Reference counting still frees everything without a cycle at once.
"""

from __future__ import annotations

import gc

# A collection every this many ticks: a job's chunk (2,000 rows by default) or a worker's batch.
FULL_EVERY = 32


class PacedCollector:
    """`with PacedCollector() as collector: ... collector.tick() ...`; on exit the collector is as it was."""

    def __init__(self, full_every: int = FULL_EVERY) -> None:
        self.full_every = full_every
        self.ticks = 0
        self._was_enabled = gc.isenabled()
        self._froze = False

    def __enter__(self) -> PacedCollector:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        self._was_enabled = gc.isenabled()
        # A process that froze objects itself (or runs another collector) keeps them frozen after stop().
        self._froze = gc.get_freeze_count() == 0
        gc.collect()
        gc.freeze()
        gc.disable()

    def tick(self) -> None:
        self.ticks += 1
        gc.collect(2 if self.ticks % self.full_every == 0 else 0)

    def stop(self) -> None:
        if self._froze:
            gc.unfreeze()
        gc.collect()
        if self._was_enabled:
            gc.enable()
