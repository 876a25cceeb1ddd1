"""glibc's malloc in a worker (handlers/host_memory.py): large blocks mapped and given back when freed, and what a
batch freed in the middle of the heap handed back by malloc_trim once the worker grew past its slack."""

from __future__ import annotations

from handlers.host_memory import MIB, MMAP_THRESHOLD, TRIM_SLACK, HostMemory, rss_bytes


def test_a_batch_that_left_the_heap_larger_is_followed_by_a_trim_that_gives_it_back():
    memory = HostMemory.for_this_process()
    assert memory.libc is not None  # every machine here runs glibc
    memory.settle()
    assert memory.after_batch() is False  # nothing grew
    blocks = [bytearray(MMAP_THRESHOLD // 8) for _ in range(128)]  # 64 MiB of heap blocks, each written (zeroed)
    keep = blocks[-1]  # the heap's top stays in use: the free middle goes back only through malloc_trim
    del blocks
    grown = rss_bytes()
    assert grown > memory.resting + TRIM_SLACK + 32 * MIB
    assert memory.after_batch() is True
    assert rss_bytes() < grown - 32 * MIB
    assert memory.resting == rss_bytes()  # what the trim left is the new resting size
    assert memory.after_batch() is False
    assert len(keep) == MMAP_THRESHOLD // 8


def test_a_block_over_the_threshold_is_given_back_as_soon_as_it_is_freed():
    HostMemory.for_this_process().settle()
    before = rss_bytes()
    block = bytearray(64 * MIB)
    assert rss_bytes() > before + 60 * MIB
    del block
    assert rss_bytes() < before + 4 * MIB


def test_without_glibc_nothing_is_changed():
    memory = HostMemory(None)
    memory.settle()
    assert memory.after_batch() is False
