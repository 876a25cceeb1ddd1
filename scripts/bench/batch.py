"""`make bench`: a 1,000,000-row batch job through the bulk lane and in-process, against the pipeline ceiling.

    python -m scripts.bench.batch [--model NAME] [--rows 1000000] [--chunk-size 2000] [--concurrency 8] [--prefetch 2]

Serves model_store/<model>.mar (default: the first model) from a throwaway TorchServe (free ports), runs its samples
repeated to --rows (scripts/jobs/example.py), as Parquet (an `instance` column; the digits' 64 ints a row), through
its bulk lane (progress bar on), then the same
job in-process twice: one thread reading, decoding, running and writing (--prefetch 0) and with
chunks read and decoded ahead (--prefetch N); then once more with the same rows as JSONL (--prefetch N), what
reading and decoding text costs against Parquet's numpy rows. The ceiling is the core alone over pre-decoded chunks
of the same size, on the same torch threads, in this process: what the in-process job would do if reading, decoding
and writing cost nothing. It runs twice, half the rows before the in-process jobs and half after, and counts as
one: the core's own speed on a shared machine moves by up to 2x between runs minutes apart.
Checks each output holds exactly one result per input row, samples each in-process job's resident memory,
prints rows/s and writes them to docs/benchmarks.md (its own section; other sections of that file are kept).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import torch

from handlers.collector import PacedCollector
from handlers.core import torch_threads
from handlers.decoding import Payload
from models import registry
from scripts import cli
from scripts.archive.core import load_core, malloc_as_lane
from scripts.bench.pipeline import Timed
from scripts.bench.report import REPORT, TARGETS, machine, replace_section
from scripts.errors import ScriptError
from scripts.jobs.batch_job import PREFETCH, JobConfig, JobSummary, run_job
from scripts.jobs.example import write_example
from scripts.layout import BUILD, MODEL_STORE, ROOT
from scripts.server.temporary import temporary_server

# A batch job through the bulk lane keeps at least TARGET of the in-process rows/s, and the in-process job
# CEILING_TARGET of the pipeline ceiling (scripts/bench/targets.json).
TARGET = TARGETS["batch"]["bulk_over_in_process"]
CEILING_TARGET = TARGETS["batch"]["in_process_over_ceiling"]
# The ceiling cycles over this many pre-decoded chunks (memory stays small at any --rows).
CEILING_CHUNKS = 20


@dataclass(frozen=True)
class Ceiling(Timed):
    """`count` rows through the core in `seconds`: `workers` passes at once, each on `threads` torch threads."""

    threads: int = 1
    workers: int = 1
    rows_per_second = Timed.per_second

    @property
    def layout(self) -> str:
        passes = "1 pass" if self.workers == 1 else f"{self.workers} passes at once"
        return f"{passes} of {self.threads} torch thread{'s' if self.threads > 1 else ''}"

    def __add__(self, other: Ceiling) -> Ceiling:
        return Ceiling(self.count + other.count, self.seconds + other.seconds, threads=self.threads, workers=self.workers)


@dataclass(frozen=True)
class BenchResult:
    model: str
    rows: int
    chunk_size: int
    concurrency: int
    prefetch: int
    server: JobSummary
    serial: JobSummary  # in-process, --prefetch 0
    in_process: JobSummary  # in-process, --prefetch N
    jsonl: JobSummary  # in-process, --prefetch N, the same rows as JSONL
    ceiling: Ceiling  # both halves together
    ceiling_halves: tuple[float, float]  # rows/s before and after the in-process jobs
    serial_rss_growth_mb: float
    rss_growth_mb: float
    jsonl_rss_growth_mb: float
    other_ceilings: list[Ceiling]  # the slower layouts, both halves together

    @property
    def best_in_process(self) -> float:
        """The faster in-process run: what the bulk lane is held against."""
        return max(self.serial.rows_per_second, self.in_process.rows_per_second)

    def text(self) -> str:
        ratio = self.server.rows_per_second / self.best_in_process
        ceiling = self.ceiling.rows_per_second
        return "\n".join(
            [
                f"{self.rows:,} rows ({self.model}'s samples repeated, Parquet), chunks of {self.chunk_size} rows",
                f"  bulk lane ({self.concurrency} chunks in flight): {self.server.rows_per_second:,.0f} rows/s "
                f"({self.server.seconds:.1f}s, {self.server.predicted:,} results)",
                f"  in-process, --prefetch 0:        {self.serial.rows_per_second:,.0f} rows/s "
                f"({self.serial.seconds:.1f}s; {self.serial.rows_per_second / ceiling:.2f} of the ceiling; "
                f"resident memory +{self.serial_rss_growth_mb:.0f} MB at most)",
                f"  in-process, --prefetch {self.prefetch}:        {self.in_process.rows_per_second:,.0f} rows/s "
                f"({self.in_process.seconds:.1f}s; {self.in_process.rows_per_second / ceiling:.2f} of the ceiling; "
                f"resident memory +{self.rss_growth_mb:.0f} MB at most)",
                f"  in-process, JSONL, --prefetch {self.prefetch}: {self.jsonl.rows_per_second:,.0f} rows/s "
                f"({self.jsonl.seconds:.1f}s; {self.jsonl.rows_per_second / ceiling:.2f} of the ceiling; "
                f"resident memory +{self.jsonl_rss_growth_mb:.0f} MB at most)",
                f"  ceiling (core over pre-decoded chunks, {self.ceiling.layout}): {ceiling:,.0f} rows/s "
                f"({self.ceiling_halves[0]:,.0f} before the in-process jobs, {self.ceiling_halves[1]:,.0f} after)"
                + "".join(f"; {other.layout}: {other.rows_per_second:,.0f}" for other in self.other_ceilings),
                f"  bulk lane / the faster in-process run: {ratio:.2f}x",
            ]
        )


def pipeline_ceiling(model: str, archive: Path, rows: int, chunk_size: int, workers: int = 1) -> Ceiling:
    """The core's predict over chunks decoded beforehand, `rows` rows in all: one pass at a time on this process's
    torch threads, or `workers` passes at once on one torch thread each (what an in-process job on the CPU runs,
    scripts/jobs/batch_job.py forward_workers)."""
    with torch_threads(1) if workers > 1 else contextlib.nullcontext():
        core = load_core(archive)
        instances = registry.model(model).samples().request(chunk_size * CEILING_CHUNKS)
        starts = range(0, len(instances), chunk_size)
        chunks = [core.decode(Payload(items=instances[i : i + chunk_size], raw=False)) for i in starts]
        core.predict(chunks[0])  # warm-up
        pool, in_flight = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ceiling"), deque()
        with pool, PacedCollector() as collector:  # the jobs' collector (scripts/jobs/batch_job.py): same pace
            done, started = 0, time.perf_counter()
            while done < rows:
                chunk = chunks[(done // chunk_size) % len(chunks)][: rows - done]
                in_flight.append(pool.submit(core.predict, chunk))
                done += len(chunk)
                while len(in_flight) > workers - 1 and in_flight:
                    in_flight.popleft().result()
                    collector.tick()
            while in_flight:
                in_flight.popleft().result()
                collector.tick()
            seconds = time.perf_counter() - started
        return Ceiling(done, seconds, threads=torch.get_num_threads(), workers=workers)


def ceiling_layouts(model: str, archive: Path, rows: int, chunk_size: int) -> dict[int, Ceiling]:
    """The ceiling in each layout a job can run (one pass on every torch thread; a pass per thread on one each),
    `rows` rows in all, alternated: the bench holds the jobs to the faster."""
    layouts = sorted({1, torch.get_num_threads()})
    share = rows // len(layouts)
    return {workers: pipeline_ceiling(model, archive, share, chunk_size, workers) for workers in layouts}


@contextmanager
def peak_rss_growth() -> Iterator[list[float]]:
    """Samples this process's resident memory every 0.2 s; yields a list that holds, after the block, the
    largest growth over the start in MB."""
    process, stop, peak = psutil.Process(), threading.Event(), [0]
    start = process.memory_info().rss

    def sample() -> None:
        while not stop.wait(0.2):
            peak[0] = max(peak[0], process.memory_info().rss - start)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    growth: list[float] = []
    try:
        yield growth
    finally:
        stop.set()
        sampler.join()
        growth.append(peak[0] / 2**20)


def count_lines(path: Path) -> int:
    with path.open("rb") as lines:
        return sum(1 for line in lines if line.strip())


def bench(model: str, rows: int, chunk_size: int, concurrency: int, prefetch: int, workdir: Path) -> BenchResult:
    text = workdir / f"{model}-{rows}.jsonl"
    if not text.exists() or count_lines(text) != rows:
        write_example(model, rows, text)
    source = workdir / f"{model}-{rows}.parquet"
    if not source.exists() or pq.ParquetFile(source).metadata.num_rows != rows:
        write_example(model, rows, source)
    archive = MODEL_STORE / f"{model}.mar"

    def job(output: str, input: Path = source, **runner) -> JobSummary:
        """The same rows and chunks each time; `runner` says where they go (a server, or in-process)."""
        config = JobConfig(model=model, input=input, output=workdir / output, chunk_size=chunk_size, overwrite=True, **runner)
        return run_job(config)

    with temporary_server(archive, archive.name) as server:
        served = job("bench-server.jsonl", concurrency=concurrency, config=server.config, key_file=server.endpoints.key_file)
    print(served.text(), file=sys.stderr)
    # From here on this process's malloc is set as the bulk lane's worker sets its own (the ceiling's upper bound, and
    # the in-process jobs after it): with glibc's adaptive threshold the core alone ran at one of two speeds from
    # one run to the next, as its activations were or were not faulted in again each pass.
    malloc_as_lane(archive, f"{model}{registry.BULK_SUFFIX}")
    before = ceiling_layouts(model, archive, rows // 2, chunk_size)
    with peak_rss_growth() as serial_rss:
        serial = job("bench-in-process-serial.jsonl", in_process=True, archive=archive, prefetch=0)
    print(serial.text(), file=sys.stderr)
    with peak_rss_growth() as local_rss:
        local = job("bench-in-process.jsonl", in_process=True, archive=archive, prefetch=prefetch)
    print(local.text(), file=sys.stderr)
    with peak_rss_growth() as jsonl_rss:
        from_text = job("bench-in-process-jsonl.jsonl", input=text, in_process=True, archive=archive, prefetch=prefetch)
    print(from_text.text(), file=sys.stderr)
    after = ceiling_layouts(model, archive, rows - rows // 2, chunk_size)
    layouts = {workers: before[workers] + after[workers] for workers in before}
    fastest = max(layouts, key=lambda workers: layouts[workers].rows_per_second)
    ceiling = layouts[fastest]
    halves = (before[fastest].rows_per_second, after[fastest].rows_per_second)
    others = [layout for workers, layout in layouts.items() if workers != fastest]
    for summary in (served, serial, local, from_text):
        written = count_lines(summary.output)
        if written != rows or summary.failed:
            raise ScriptError(
                f"{summary.output}: {written} results and {summary.failed} errors for {rows} rows; expected one result per row"
            )
    return BenchResult(
        model,
        rows,
        chunk_size,
        concurrency,
        prefetch,
        served,
        serial,
        local,
        from_text,
        ceiling,
        halves,
        serial_rss[0],
        local_rss[0],
        jsonl_rss[0],
        others,
    )


def write_report(result: BenchResult) -> None:
    ratio = result.server.rows_per_second / result.best_in_process
    ceiling = result.ceiling.rows_per_second
    share, serial_share = result.in_process.rows_per_second / ceiling, result.serial.rows_per_second / ceiling
    best = result.best_in_process / ceiling
    replace_section(
        "batch-job bench",
        "\n".join(
            [
                "## Batch jobs: bulk lane vs in-process vs the pipeline ceiling (`make bench`)",
                "",
                f"Measured {date.today().isoformat()} on {machine()}. Figures vary with whatever else runs on the machine.",
                "",
                f"Input: {result.model}'s samples repeated (scripts/jobs/example.py) as Parquet (an `instance` column, "
                "numbers read as numpy rows), and once more as JSONL (one JSON object a line, read and decoded as Python "
                "values).",
                "",
                "| path | rows | rows/s | seconds | results |",
                "| --- | ---: | ---: | ---: | ---: |",
                f"| `{result.model}-bulk` lane, chunks of {result.chunk_size}, {result.concurrency} in flight | "
                f"{result.rows:,} | "
                f"{result.server.rows_per_second:,.0f} | {result.server.seconds:.1f} | {result.server.predicted:,} |",
                f"| in-process, one thread reads, decodes, runs (`--prefetch 0`), chunks of {result.chunk_size} | "
                f"{result.rows:,} | {result.serial.rows_per_second:,.0f} | {result.serial.seconds:.1f} | "
                f"{result.serial.predicted:,} |",
                f"| in-process, {result.prefetch} chunks read and decoded ahead "
                f"(`--prefetch {result.prefetch}`, the default) | "
                f"{result.rows:,} | {result.in_process.rows_per_second:,.0f} | {result.in_process.seconds:.1f} | "
                f"{result.in_process.predicted:,} |",
                f"| in-process, the same rows as JSONL (`--prefetch {result.prefetch}`) | "
                f"{result.rows:,} | {result.jsonl.rows_per_second:,.0f} | {result.jsonl.seconds:.1f} | "
                f"{result.jsonl.predicted:,} |",
                f"| ceiling: the core alone over pre-decoded chunks of {result.chunk_size}, "
                f"{result.ceiling.layout} | "
                f"{result.ceiling.count:,} | {ceiling:,.0f} | {result.ceiling.seconds:.1f} | |",
                "",
                f"The ceiling ran in two halves, before the in-process jobs ({result.ceiling_halves[0]:,.0f} rows/s) and after "
                f"them ({result.ceiling_halves[1]:,.0f}); the row above is both together. Each half ran every layout a job "
                "can run, alternated, and the row above is the faster"
                + "".join(f" (the other, {other.layout}: {other.rows_per_second:,.0f} rows/s)" for other in result.other_ceilings)
                + ". Jobs with prefetch on the CPU run a pass per torch thread at once, on one thread each "
                "(scripts/jobs/batch_job.py `forward_workers`). Both jobs and the ceiling pace "
                "Python's garbage collector by chunk (handlers/collector.py).",
                "",
                f"In-process / ceiling: {serial_share:.2f} with `--prefetch 0`, {share:.2f} with `--prefetch {result.prefetch}` "
                f"(target >= {CEILING_TARGET:g} for the faster run: {'met' if best >= CEILING_TARGET else '**missed**'}); "
                f"{result.jsonl.rows_per_second / ceiling:.2f} from JSONL. "
                "The ceiling runs in the same process on the same torch threads as the jobs. Resident memory grew by "
                f"at most {result.serial_rss_growth_mb:.0f} MB, {result.rss_growth_mb:.0f} MB and "
                f"{result.jsonl_rss_growth_mb:.0f} MB over each job (sampled every 0.2 s).",
                "",
                f"Bulk lane / the faster in-process run: {ratio:.2f}x "
                f"(target >= {TARGET:g}x: {'met' if ratio >= TARGET else '**missed**'}). "
                "The bulk lane runs one worker, a request's micro-batches side by side on one torch thread each "
                "(handler.forward_passes), and the job sends it numeric rows as .npy arrays; the in-process job runs the "
                "same core in this process. "
                "Where the time goes and what was cut: [batch-jobs.md](batch-jobs.md#throughput-where-the-time-goes).",
            ]
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    registry.add_model_option(parser)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=JobConfig.concurrency)
    parser.add_argument("--prefetch", type=int, default=PREFETCH, help="in-process chunks decoded ahead (default %(default)s)")
    parser.add_argument("--workdir", type=Path, default=BUILD / "batch")
    parser.add_argument("--no-report", action="store_true", help=f"do not write {REPORT.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = bench(args.model, args.rows, args.chunk_size, args.concurrency, args.prefetch, args.workdir)
    print(result.text())
    if not args.no_report:
        write_report(result)
        print(f"written to {REPORT}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
