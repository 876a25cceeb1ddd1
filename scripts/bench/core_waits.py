"""How long a stream lane's threads wait for a core, and how long when a background thread held it: `perf sched`.

The cooperative bound (handlers/yielding.py) is measured from the bulk lane's side: a pass thread's run from a rise
of the signal to its next yield point. On the CPU the kernel preempts a SCHED_IDLE thread for a normal one, so what
the stream lane feels is the kernel's doing as much as the yield's. This reads it from the stream lane's side, on
the real server beside the real job: every time one of the lane's threads (its workers', its frontend's) is put on a
core, how long it had been runnable (woken, or preempted) before it ran, from the kernel's scheduler events
(`perf sched record`, system wide; `perf sched timehist` computes the delays). Where the thread took the core from a
background thread (a bulk lane worker's, the job's) after waiting on that core, that delay bounds from above how long
the background lane kept the core after the stream lane wanted it (other threads may have run there for part of the
wait). A thread the kernel moved to that core after it became runnable had waited for another core: left out,
counted apart.

Needs Debian's linux-perf and the right to trace the scheduler system wide (root, or kernel.perf_event_paranoid -1):
`unavailable()` says why not, and the bench then says so instead of a figure.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

IDLE = "<idle>"
TIMEHIST = ["perf", "sched", "timehist", "-M"]  # -M: the moves of tasks between cores too (waits_in)
MIGRATED = re.compile(r"migrated: .*\[(-?\d+)(?:/-?\d+)?\] cpu \d+ => \d+\s*$")
# A move within this long of becoming runnable is the wake-up's own choice of core, not a later pull.
WAKE_MOVE_MS = 0.02


@dataclass
class Waits:
    """Milliseconds from runnable to running, each time one of the stream lane's threads was put on a core."""

    all_ms: list[float] = field(default_factory=list)
    after_background_ms: list[float] = field(default_factory=list)  # the core came from a background thread
    moved_in: int = 0  # waits that ended on a core a background thread left, but began on another core


def unavailable() -> str | None:
    """None where `perf sched record` can trace the scheduler here; else why not, in a few words."""
    if shutil.which("perf") is None:
        return "perf is not installed (Debian's linux-perf)"
    with tempfile.TemporaryDirectory(prefix="perf-sched-") as folder:
        done = subprocess.run(
            ["perf", "sched", "record", "-o", str(Path(folder) / "probe.data"), "--", "true"],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return f"perf sched record failed: {lines[0] if lines else f'exit {done.returncode}'}"
    return None


@dataclass
class Recording:
    error: str | None = None  # why perf failed, once the recording is done


@contextlib.contextmanager
def recording(path: Path, seconds: float) -> Iterator[Recording]:
    """The scheduler's events on every core into `path` for about `seconds` from entry (the block should last as long;
    perf's own start-up, a fraction of a second, is not recorded). The Recording it gives says, after the block,
    whether perf failed."""
    recorded = Recording()
    process = subprocess.Popen(
        ["perf", "sched", "record", "-o", str(path), "--", "sleep", str(seconds)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield recorded
    finally:
        _, stderr = process.communicate(timeout=seconds + 60)
        if process.returncode != 0:
            lines = [line for line in stderr.splitlines() if line.strip()]
            recorded.error = f"perf sched record exited {process.returncode}: {lines[-1] if lines else ''}"


def read(path: Path, stream: Iterable[int], background: Iterable[int]) -> Waits:
    """The waits of the threads of processes `stream` in a recording, those after a thread of `background` apart."""
    return read_groups(path, {"stream": stream}, background)["stream"]


def read_groups(path: Path, groups: dict[str, Iterable[int]], background: Iterable[int]) -> dict[str, Waits]:
    """read() for each group of processes (a lane's workers, its frontend), the recording read once."""
    text = subprocess.run(TIMEHIST + ["-i", str(path)], capture_output=True, text=True, check=True).stdout
    return {name: waits_in(text, set(pids), set(background)) for name, pids in groups.items()}


def waits_in(timehist: str, stream: set[int], background: set[int]) -> Waits:
    """From `perf sched timehist -M` text: a line per switch-out, the task that ran (its `[tid/pid]`), its wait before
    it woke, its delay from runnable to running and its run; and a line per move of a task between cores. The task that
    ran before it on the same core is the previous line of that core: the core came from there. A thread moved after it
    became runnable waited on another core first."""
    waits = Waits()
    previous: dict[str, int | None] = {}  # core -> pid of the task that last ran there (None: idle or unknown)
    moved_at: dict[int, float] = {}  # tid -> when it last moved between cores (s)
    for line in timehist.splitlines():
        moved = MIGRATED.search(line)
        if moved is not None:
            with contextlib.suppress(ValueError):
                moved_at[int(moved.group(1))] = float(line.split()[0])
            continue
        parsed = _parse(line)
        if parsed is None:
            continue
        at, core, tid, pid, delay_ms, run_ms = parsed
        if pid is not None and pid in stream:
            waits.all_ms.append(delay_ms)
            if previous.get(core) in background:
                runnable = at - (run_ms + delay_ms) / 1000
                if moved_at.get(tid, float("-inf")) > runnable + WAKE_MOVE_MS / 1000:
                    waits.moved_in += 1
                else:
                    waits.after_background_ms.append(delay_ms)
        previous[core] = pid
    return waits


def _parse(line: str) -> tuple[float, str, int | None, int | None, float, float] | None:
    """(time s, core, tid, pid, sch delay ms, run ms) of a timehist switch line, tid and pid None for the idle task;
    None for a header or anything else."""
    fields = line.split()
    if len(fields) < 6 or not fields[1].startswith("[") or not fields[1].endswith("]"):
        return None
    try:
        at, delay_ms, run_ms = float(fields[0]), float(fields[-2]), float(fields[-1])
        float(fields[-3])
    except ValueError:
        return None
    task = " ".join(fields[2:-3])
    if task == IDLE:
        return at, fields[1], None, None, delay_ms, run_ms
    if not task.endswith("]") or "[" not in task:
        return None
    ids = task[task.rindex("[") + 1 : -1].split("/")
    try:
        tid, pid = int(ids[0]), int(ids[-1])
    except ValueError:
        return None
    return at, fields[1], tid, pid, delay_ms, run_ms
