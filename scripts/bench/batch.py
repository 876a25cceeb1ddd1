"""`make bench`: a 100,000-row batch job through the bulk lane and in-process, side by side.

    python -m scripts.bench.batch [--rows 100000] [--chunk-size 2000] [--concurrency 4]

Serves model_store/digits.mar from a throwaway TorchServe (free ports), runs the held-out digits
repeated to --rows through `digits-bulk` (progress bar on), then the same job in-process, checks each
output holds exactly one result per input row, prints rows/s and writes them to docs/benchmarks.md
(its own section; other sections of that file are kept).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from models.digits.samples import digit_rows, write_jsonl
from scripts import cli
from scripts.bench.report import REPORT, machine, replace_section
from scripts.errors import ScriptError
from scripts.jobs.batch_job import JobConfig, JobSummary, run_job
from scripts.layout import BUILD, MODEL_STORE, ROOT
from scripts.server.temporary import temporary_server

# Issue 9: a batch job through the bulk lane keeps at least this share of the in-process rows/s.
TARGET = 0.95


@dataclass(frozen=True)
class BenchResult:
    rows: int
    chunk_size: int
    concurrency: int
    server: JobSummary
    in_process: JobSummary

    def text(self) -> str:
        ratio = self.server.rows_per_second / self.in_process.rows_per_second
        return "\n".join(
            [
                f"{self.rows:,} rows (held-out digits repeated), chunks of {self.chunk_size} rows",
                f"  bulk lane ({self.concurrency} chunks in flight): {self.server.rows_per_second:,.0f} rows/s "
                f"({self.server.seconds:.1f}s, {self.server.predicted:,} results)",
                f"  in-process:                      {self.in_process.rows_per_second:,.0f} rows/s "
                f"({self.in_process.seconds:.1f}s, {self.in_process.predicted:,} results)",
                f"  bulk lane / in-process: {ratio:.2f}x",
            ]
        )


def count_lines(path: Path) -> int:
    with path.open("rb") as lines:
        return sum(1 for line in lines if line.strip())


def bench(rows: int, chunk_size: int, concurrency: int, workdir: Path) -> BenchResult:
    source = workdir / f"digits-{rows}.jsonl"
    if not source.exists() or count_lines(source) != rows:
        write_jsonl(source, digit_rows(rows))
    archive = MODEL_STORE / "digits.mar"

    def job(output: str, **runner) -> JobSummary:
        """The same rows and chunks each time; `runner` says where they go (a server, or in-process)."""
        config = JobConfig(model="digits", input=source, output=workdir / output, chunk_size=chunk_size, overwrite=True, **runner)
        return run_job(config)

    with temporary_server(archive) as server:
        served = job("bench-server.jsonl", concurrency=concurrency, config=server.config, key_file=server.endpoints.key_file)
    print(served.text(), file=sys.stderr)
    local = job("bench-in-process.jsonl", in_process=True, archive=archive)
    print(local.text(), file=sys.stderr)
    for summary in (served, local):
        written = count_lines(summary.output)
        if written != rows or summary.failed:
            raise ScriptError(
                f"{summary.output}: {written} results and {summary.failed} errors for {rows} rows; expected one result per row"
            )
    return BenchResult(rows, chunk_size, concurrency, served, local)


def write_report(result: BenchResult) -> None:
    ratio = result.server.rows_per_second / result.in_process.rows_per_second
    replace_section(
        "batch-job bench",
        "\n".join(
            [
                "## Batch jobs: bulk lane vs in-process (`make bench`)",
                "",
                f"Measured {date.today().isoformat()} on {machine()}. Figures vary with whatever else runs on the machine.",
                "",
                "| path | rows | rows/s | seconds | results |",
                "| --- | ---: | ---: | ---: | ---: |",
                f"| `digits-bulk` lane, chunks of {result.chunk_size}, {result.concurrency} in flight | {result.rows:,} | "
                f"{result.server.rows_per_second:,.0f} | {result.server.seconds:.1f} | {result.server.predicted:,} |",
                f"| in-process (same core, same archive), chunks of {result.chunk_size} | {result.rows:,} | "
                f"{result.in_process.rows_per_second:,.0f} | {result.in_process.seconds:.1f} | {result.in_process.predicted:,} |",
                "",
                f"Bulk lane / in-process: {ratio:.2f}x (target >= {TARGET:g}x: {'met' if ratio >= TARGET else '**missed**'}). "
                "The bulk lane runs one worker with every core; the in-process job runs the same core in this process.",
            ]
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--chunk-size", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=BUILD / "batch")
    parser.add_argument("--no-report", action="store_true", help=f"do not write {REPORT.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = bench(args.rows, args.chunk_size, args.concurrency, args.workdir)
    print(result.text())
    if not args.no_report:
        write_report(result)
        print(f"written to {REPORT}")
    return 0


if __name__ == "__main__":
    cli.run(lambda: main())
