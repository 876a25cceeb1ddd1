"""`make bench` (bulk half, every model): a batch job through each model's bulk lane against the same job in process.

    python -m scripts.bench.bulk [--models NAME ...] [--seconds 30] [--rounds 2] [--no-report]

Per model (models/, in order), from its own folder alone: the job's input is the model's samples (samples.json)
repeated to about --seconds of in-process work (a first short in-process job measures the rate), as JSONL
({"id", "instance"} a line), in chunks of the bulk lane's own limit on rows a request (at most 1000). Then, --rounds
times alternated: the job through `<model>-bulk` of a throwaway TorchServe serving that model's lanes (free ports,
the job's defaults: 8 chunks in flight), and the job in process (`--in-process`: the archive's core in this
process, the job's default prefetch). Every output is checked row by row against the sample answer it must be
(the samples' own match), so both runners give the same answers, and every row exactly once. Writes the `bulk
lanes` region of docs/benchmarks.md: rows/s of each runner (the rounds' total rows over their total seconds) and
bulk / in-process against scripts/bench/targets.json's batch.bulk_over_in_process. The digits job at a million
rows, its ceiling and its memory are `python -m scripts.bench.batch`.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import orjson

from models import registry
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.bench.report import REPORT, TARGETS, machine, percentile, replace_section
from scripts.errors import ScriptError
from scripts.jobs.batch_job import JobConfig, JobSummary, run_job
from scripts.layout import MODEL_STORE
from scripts.server.temporary import temporary_server

SECTION = "bulk lanes"
TARGET = TARGETS["batch"]["bulk_over_in_process"]
MAX_CHUNK = 1000


@dataclass
class BulkResult:
    model: str
    rows: int
    chunk_size: int
    served: list[JobSummary] = field(default_factory=list)
    in_process: list[JobSummary] = field(default_factory=list)

    @staticmethod
    def rate(runs: list[JobSummary]) -> float:
        seconds = sum(run.seconds for run in runs)
        return sum(run.total for run in runs) / seconds if seconds else 0.0

    @property
    def ratio(self) -> float:
        local = self.rate(self.in_process)
        return self.rate(self.served) / local if local else 0.0

    def request_ms(self) -> str:
        """p50 / p99 ms of the bulk lane's requests (one chunk each), every round's together."""
        seconds = [second for run in self.served for second in run.request_seconds]
        if not seconds:
            return "n/a"
        return f"{percentile(seconds, 0.50) * 1000:,.0f} / {percentile(seconds, 0.99) * 1000:,.0f} ({len(seconds)})"

    def row(self) -> str:
        met = "met" if self.ratio >= TARGET else "**missed**"
        rounds = " / ".join(
            f"{a.rows_per_second:,.1f} vs {b.rows_per_second:,.1f}" for a, b in zip(self.served, self.in_process, strict=True)
        )
        return (
            f"| {self.model} | {date.today().isoformat()} | {self.rows:,} | {self.chunk_size} | {self.rate(self.served):,.1f} | "
            f"{self.request_ms()} | {self.rate(self.in_process):,.1f} | {self.ratio:.2f}x ({rounds}) | >= {TARGET:g}x | {met} |"
        )


def write_input(found: registry.Model, rows: int, path: Path) -> Path:
    """`rows` JSONL lines cycling through the model's samples; a row's id is its number, its answer the sample's."""
    samples = found.samples()
    with path.open("wb") as out:
        for number in range(rows):
            out.write(orjson.dumps({"id": number, "instance": samples.instances[number % len(samples.instances)]}) + b"\n")
    return path


def check_output(found: registry.Model, summary: JobSummary, rows: int) -> None:
    """Every row answered once, each with its sample's answer."""
    samples, seen = found.samples(), set()
    with summary.output.open("rb") as lines:
        for line in lines:
            record = orjson.loads(line)
            number = int(record["id"])
            if number in seen:
                raise ScriptError(f"{summary.output}: row {number} answered twice")
            seen.add(number)
            problem = samples.problem(record["prediction"], samples.answers[number % len(samples.answers)])
            if problem:
                raise ScriptError(f"{summary.output}: row {number} ({summary.runner}): {problem}")
    if len(seen) != rows or summary.failed:
        raise ScriptError(f"{summary.output}: {len(seen)} rows answered and {summary.failed} rejected of {rows}")


def chunk_size(found: registry.Model) -> int:
    lane = found.bulk_lane
    if lane is None:
        raise ScriptError(f"models/{found.name}: no bulk lane ({found.name}{registry.BULK_SUFFIX}) to bench")
    limit = MarFile(MODEL_STORE / f"{found.name}.mar").settings().rows_for(lane.name)
    return min(limit or MAX_CHUNK, MAX_CHUNK)


def bench_model(found: registry.Model, seconds: float, rounds: int, workdir: Path) -> BulkResult:
    archive, size = MODEL_STORE / f"{found.name}.mar", chunk_size(found)

    def job(runner: str, source: Path, **settings) -> JobSummary:
        output = workdir / f"{found.name}-{runner}-output.jsonl"
        config = JobConfig(model=found.name, input=source, output=output, chunk_size=size, overwrite=True, progress_bar=False)
        return run_job(dataclasses.replace(config, **settings))

    probe = job("probe", write_input(found, size * 2, workdir / f"{found.name}-probe.jsonl"), in_process=True, archive=archive)
    rows = max(size * 2, round(probe.rows_per_second * seconds / size) * size)
    source = write_input(found, rows, workdir / f"{found.name}.jsonl")
    result = BulkResult(found.name, rows, size)
    print(f"{found.name}: {rows:,} rows in chunks of {size} (probe {probe.rows_per_second:,.1f} rows/s)", flush=True)
    with temporary_server(archive, f"{found.name}.mar") as server:
        for _ in range(rounds):
            served = job("bulk", source, config=server.config, key_file=server.endpoints.key_file)
            check_output(found, served, rows)
            local = job("in-process", source, in_process=True, archive=archive)
            check_output(found, local, rows)
            result.served.append(served)
            result.in_process.append(local)
            print(f"  bulk lane {served.rows_per_second:,.1f} rows/s, in process {local.rows_per_second:,.1f}", flush=True)
    return result


def report(results: list[BulkResult], seconds: float, kept: list[str] = ()) -> str:
    """The region's text: this run's rows, then `kept` (earlier runs' rows of models not run this time)."""
    lines = [
        "## Bulk lanes against in-process jobs, every model (`make bench`)",
        "",
        f"On {machine()} (`python -m scripts.bench.bulk`; a row says when; `--models` rewrites its own): each model's samples "
        f"repeated to about {seconds:g} s of in-process work, as JSONL; the job through the bulk lane of a TorchServe "
        "serving that model, and the same job `--in-process`, alternated; every output row checked against its "
        "sample's answer (both runners answered every row, exactly once, as the samples say). A request of the bulk lane "
        "is one chunk, 8 in flight: its p50 / p99 ms, from sending it to its answer (and how many requests).",
        "",
        "| model | measured | rows | chunk | bulk lane rows/s | bulk lane p50 / p99 ms a request | in-process rows/s "
        "| bulk / in-process (each round) | goal | |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |",
        *sorted([*(result.row() for result in results), *kept]),
    ]
    return "\n".join(lines)


def kept_rows(page: str, run: set[str]) -> list[str]:
    """The table rows of the region as `page` has it, for the models not in `run`."""
    region = re.search(f"<!-- {SECTION}: begin -->(.*?)<!-- {SECTION}: end -->", page, re.DOTALL)
    rows = re.finditer(r"^\| ([a-z][a-z0-9_]*) \| \d{4}-\d\d-\d\d \|.*$", region.group(1) if region else "", re.MULTILINE)
    return [row.group(0) for row in rows if row.group(1) not in run]


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--models", nargs="+", default=list(registry.models()), help="default: every model of models/")
    parser.add_argument("--seconds", type=float, default=30.0, help="about this long a job in process (default 30)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-report", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as folder:
        results = [bench_model(registry.model(name), args.seconds, args.rounds, Path(folder)) for name in args.models]
    text = report(results, args.seconds, kept_rows(REPORT.read_text(), {r.model for r in results}))
    print(text, file=sys.stderr)
    if not args.no_report:
        replace_section(SECTION, text, after=("batch-job bench",))
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
