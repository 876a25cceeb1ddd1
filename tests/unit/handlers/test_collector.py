"""The paced garbage collector (handlers/collector.py): off between ticks, a batch's cycles freed at its tick,
what the process held at the start frozen, Python's own collector back as it was on exit."""

from __future__ import annotations

import gc
import weakref

from handlers.collector import PacedCollector


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_cycle_made_during_a_batch_is_freed_at_its_tick_and_not_before():
    assert gc.isenabled()
    with PacedCollector(full_every=4) as collector:
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # what the process held at the start: never scanned again
        made = cycle()
        for _ in range(2000):  # far past the 700 allocations that would run Python's own collector
            Node()
        assert made() is not None
        collector.tick()
        assert made() is None
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_every_full_every_ticks_everything_not_frozen_is_collected(monkeypatch):
    generations = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: generations.append(generation) or 0)
    collector = PacedCollector(full_every=3)
    collector.ticks = 0
    for _ in range(6):
        collector.tick()
    assert generations == [0, 0, 2, 0, 0, 2]


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with PacedCollector():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_objects_frozen_before_it_started_stay_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        # Frozen objects that are freed meanwhile (by another thread of the test process) leave the count: an
        # unfreeze would take it to 0, so "nearly all still frozen" is what tells the two apart.
        with PacedCollector():
            assert gc.get_freeze_count() >= 0.99 * frozen
        assert gc.get_freeze_count() >= 0.99 * frozen > 0  # not unfrozen: another owner froze them
    finally:
        gc.unfreeze()
