"""glibc's malloc in a worker (handlers/host_memory.py): large blocks mapped and given back when freed, and what a
batch freed in the middle of the heap handed back by malloc_trim once the worker grew past its slack."""

from __future__ import annotations

import os
import subprocess
import sys

from handlers.host_memory import MIB, HostMemory
from scripts.layout import ROOT

# Each test runs in a fresh interpreter: malloc's thresholds, its heap and what earlier tests left in it are per
# process, and a block is served from a free chunk of the heap, whatever the threshold, when one is large enough.
PRELUDE = """
import ctypes, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, so faults and RSS move page by page
from handlers.host_memory import MIB, MMAP_THRESHOLD, HostMemory, rss_bytes
"""


def fresh(code: str, *args: str) -> str:
    """Run PRELUDE + `code` in a new interpreter (glibc's own tunables left out); its stdout."""
    env = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", PRELUDE + code, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_batch_that_left_the_heap_larger_is_followed_by_a_trim_that_gives_it_back():
    fresh("""
memory = HostMemory.for_this_process()
assert memory.libc is not None  # every machine here runs glibc
memory.settle()
assert memory.after_batch() is False  # nothing grew
blocks = [bytearray(MMAP_THRESHOLD // 8) for _ in range(128)]  # 64 MiB of heap blocks, each written (zeroed)
keep = blocks[-1]  # the heap's top stays in use: the free middle goes back only through malloc_trim
del blocks
grown = rss_bytes()
assert memory.slack == MMAP_THRESHOLD
assert grown > memory.resting + memory.slack + 32 * MIB
assert memory.after_batch() is True
assert rss_bytes() < grown - 32 * MIB
assert memory.resting == rss_bytes()  # what the trim left is the new resting size
assert memory.after_batch() is False
assert len(keep) == MMAP_THRESHOLD // 8
""")


def test_a_block_over_the_threshold_is_given_back_as_soon_as_it_is_freed():
    fresh("""
HostMemory.for_this_process().settle()
before = rss_bytes()
block = bytearray(64 * MIB)
assert rss_bytes() > before + 60 * MIB
del block
assert rss_bytes() < before + 4 * MIB
""")


PASSES = """
memory = HostMemory.for_this_process(int(sys.argv[1]) * MIB)
assert memory.threshold == int(sys.argv[1]) * MIB  # mallopt took it
memory.settle()
import resource
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):  # a pass's largest block, written: a digits-bulk pass's convolution output is 8 MiB
    block = b"x" * (8 * MIB)
    del block
    memory.after_batch()
print(memory.slack // MIB, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""


def test_a_lane_with_a_higher_threshold_reuses_its_passes_blocks_instead_of_faulting_them_in_each_time():
    """A bulk lane's passes allocate blocks of several MiB every time. At the default threshold each is mapped,
    faulted in page by page and unmapped again; under the lane's threshold the heap keeps it for the next pass."""

    def faults(threshold_mib: int) -> tuple[int, int]:
        slack, count = fresh(PASSES, str(threshold_mib)).split()
        return int(slack), int(count)

    pages = 8 * MIB // os.sysconf("SC_PAGE_SIZE")
    slack, mapped = faults(4)
    assert slack == 4 and mapped > 18 * pages  # every pass faults its 2,048 pages in again
    slack, reused = faults(32)
    assert slack == 32 and reused < 3 * pages  # the first pass only (and what else the interpreter touched)


def test_without_glibc_nothing_is_changed():
    memory = HostMemory(None)
    memory.settle()
    assert memory.after_batch() is False


# A lane whose every batch grows the worker by more than one threshold (an image's activations) sets its slack
# above that need (argv[1], MiB; 0: the default): prints the first batch's trim, how many of the 9 after were
# trimmed, and their page faults.
SLACK_RUN = """
import resource, sys
slack = int(sys.argv[1]) * MIB or None
memory = HostMemory.for_this_process(slack=slack)
memory.settle()
tops = []  # each batch's last block stays in use, so the heap's top never shrinks on its own

def batch(mib):
    blocks = [bytearray(MMAP_THRESHOLD // 8) for _ in range(mib * 2)]  # heap blocks, written
    tops.append(bytearray(4096))  # allocated last, by malloc (not pymalloc): the heap's top
    del blocks
    return memory.after_batch()

first = batch(24)
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
trims = [batch(24) for _ in range(9)]
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start
print(first, sum(trims), faults)
"""


def test_a_lane_with_a_larger_slack_keeps_a_working_set_every_batch_needs_instead_of_faulting_it_in_again():
    kept = fresh(SLACK_RUN, "32").split()
    trimmed = fresh(SLACK_RUN, "0").split()
    # 24 MiB a batch is 6,144 pages: kept, the batches after the first reuse them (a few pages each)
    assert kept[:2] == ["False", "0"] and int(kept[2]) < 2500, kept
    # one threshold (4 MiB) of slack: every batch trimmed, and faulted in again
    assert trimmed[:2] == ["True", "9"] and int(trimmed[2]) > 9 * 6000, trimmed


def test_a_worker_never_keeps_more_than_its_slack_over_its_resting_size_after_a_batch():
    """Batches of growing sizes: after each, the worker holds at most its slack over the size its last trim left
    (a worker that kept what its recent batches had grown it by rose by its slack again and again: a digits-bulk
    worker +63 MiB over the ten-minute soak)."""
    fresh("""
memory = HostMemory.for_this_process(slack=16 * MIB)
memory.settle()
tops = []
trims = 0
for mib in (8, 12, 16, 20, 24, 28, 32, 36, 40):
    blocks = [bytearray(MMAP_THRESHOLD // 8) for _ in range(mib * 2)]
    tops.append(bytearray(MMAP_THRESHOLD // 8))  # the heap's top stays in use: the middle goes back only by a trim
    del blocks
    trims += memory.after_batch()
    assert rss_bytes() - memory.resting <= memory.slack, (mib, rss_bytes() - memory.resting)
assert trims >= 2, trims  # past 16 MiB of growth, given back
""")
