"""`make verify`: the held-out digits through the three paths, proof that stream and batch agree.

    python -m scripts.verify.agreement                       # both modes: the archive as built, then deterministic
    python -m scripts.verify.agreement --mode deterministic

For each mode a throwaway TorchServe serves the archive (free ports, temporary folder; `make serve`'s
server is not needed nor touched), and every held-out digit goes through
  (a) stream:     one single-row request each to the `digits` lane, many at once, so TorchServe's
                  batcher mixes them into batches of varying make-up;
  (b) bulk:       a batch job to the `digits-bulk` lane (chunks of --chunk-size rows, concurrent);
  (c) in-process: the same batch job through the handler core loaded from the same archive.
The report gives each path's accuracy and the largest score difference between any two paths.
Deterministic mode (handler.deterministic: true, served from a copy of the archive with only that
setting changed) must make all three bitwise equal; the default mode may differ by float rounding.
Exits 1 when a check fails.
"""

from __future__ import annotations

import collections
import itertools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from models.digits.samples import DigitRows, digit_rows, write_jsonl
from scripts import cli
from scripts.archive.reader import MarFile
from scripts.archive.variant import write_variant
from scripts.clients.load import send_concurrently
from scripts.errors import ScriptError
from scripts.jobs.batch_job import JobConfig, run_job
from scripts.jobs.outputs import read_results
from scripts.layout import JSON, MODEL_STORE
from scripts.server.endpoints import Endpoints
from scripts.server.temporary import temporary_server

# Default mode: a row's scores may move by float rounding when it shares a batch with other rows.
DEFAULT_TOLERANCE = 1e-5
MIN_ACCURACY = 0.95
STREAM_CLIENTS = 8


@dataclass(frozen=True)
class PathResult:
    name: str
    scores: np.ndarray  # (rows, 10)
    note: str = ""

    def accuracy(self, labels: list[int]) -> float:
        return float((self.scores.argmax(axis=1) == np.asarray(labels)).mean())


@dataclass(frozen=True)
class ModeReport:
    mode: str
    max_batch_rows: int
    labels: list[int]
    paths: list[PathResult]

    @property
    def deterministic(self) -> bool:
        return self.mode == "deterministic"

    def differences(self) -> dict[tuple[str, str], float]:
        return {(a.name, b.name): float(np.abs(a.scores - b.scores).max()) for a, b in itertools.combinations(self.paths, 2)}

    def failures(self) -> list[str]:
        problems = []
        for (a, b), difference in self.differences().items():
            allowed = 0.0 if self.deterministic else DEFAULT_TOLERANCE
            if difference > allowed:
                problems.append(f"{a} vs {b}: scores differ by {difference:.3g}, allowed {allowed:g} in {self.mode} mode")
        for path in self.paths:
            if path.accuracy(self.labels) < MIN_ACCURACY:
                problems.append(f"{path.name}: accuracy {path.accuracy(self.labels):.4f} is under {MIN_ACCURACY}")
        return problems

    def text(self) -> str:
        padding = f", every micro-batch padded to {self.max_batch_rows} rows" if self.deterministic else ""
        lines = [
            f"mode: {self.mode} "
            f"(handler.deterministic: {str(self.deterministic).lower()}, max_batch_rows={self.max_batch_rows}{padding})",
            f"rows: {len(self.labels)} held-out digits",
        ]
        for path in self.paths:
            lines.append(f"  {path.name:<11} accuracy {path.accuracy(self.labels):.4f}  {path.note}")
        for (a, b), difference in self.differences().items():
            lines.append(
                f"  max |score difference| {a} vs {b}: {difference:.3g}" + (" (bitwise equal)" if difference == 0 else "")
            )
        problems = self.failures()
        lines.append("PASS" if not problems else "FAIL: " + "; ".join(problems))
        return "\n".join(lines)


def verify_mode(mode: str, archive: Path, rows: DigitRows, workdir: Path, chunk_size: int) -> ModeReport:
    served = archive if mode == "default" else write_variant(archive, workdir / f"digits-{mode}.mar", {"deterministic": True})
    settings = MarFile(served).settings()
    if settings.deterministic != (mode == "deterministic"):
        raise ScriptError(f"{archive} already has handler.deterministic: {settings.deterministic}; pass a default archive")
    job_input = write_jsonl(workdir / "held_out.jsonl", rows)
    with temporary_server(served) as server:
        stream = stream_path(server.endpoints, rows)
        bulk = job_path(
            "bulk",
            JobConfig(
                model="digits",
                input=job_input,
                output=workdir / f"{mode}-bulk.jsonl",
                chunk_size=chunk_size,
                config=server.config,
                key_file=server.endpoints.key_file,
                progress_bar=False,
                overwrite=True,
            ),
        )
    # A different chunk size again: one more batch make-up for the same rows.
    in_process = job_path(
        "in-process",
        JobConfig(
            model="digits",
            input=job_input,
            output=workdir / f"{mode}-in-process.jsonl",
            chunk_size=chunk_size + 13,
            in_process=True,
            archive=served,
            progress_bar=False,
            overwrite=True,
        ),
    )
    return ModeReport(mode, settings.max_batch_rows, rows.labels, [stream, bulk, in_process])


def stream_path(endpoints: Endpoints, rows: DigitRows) -> PathResult:
    """One request per row to the stream lane, from several clients at once."""
    bodies = [orjson.dumps({"instances": [instance]}) for instance in rows.instances]
    started = time.perf_counter()
    answers = send_concurrently(endpoints, "digits", bodies, [JSON] * len(bodies), STREAM_CLIENTS)
    seconds = time.perf_counter() - started
    refused = [answer.reply for answer in answers if answer.reply.status_code != 200]
    if refused:
        raise ScriptError(
            f"{len(refused)} stream requests failed, the first: HTTP {refused[0].status_code} {refused[0].text[:200]}"
        )
    sizes = dict(sorted(collections.Counter(answer.batch_requests for answer in answers).items()))
    note = f"{len(answers)} single-row requests from {STREAM_CLIENTS} "
    f"clients in {seconds:.1f}s; requests by handler-call size {sizes}"
    return PathResult("stream", np.array([answer.reply.json()["predictions"][0]["scores"] for answer in answers]), note)


def job_path(name: str, config: JobConfig) -> PathResult:
    summary = run_job(config)
    if summary.failed:
        raise ScriptError(f"{name} job rejected {summary.failed} held-out rows; see {summary.errors}")
    records = read_results(config.output)
    return PathResult(
        name,
        np.array([r["prediction"]["scores"] for r in records]),
        f"batch job, chunks of {config.chunk_size} rows, {summary.predicted} results in {summary.seconds:.1f}s",
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--mode", choices=["default", "deterministic", "both"], default="both")
    parser.add_argument("--archive", type=Path, default=MODEL_STORE / "digits.mar")
    parser.add_argument("--rows", type=int, help="rows (default: the held-out split once)")
    parser.add_argument("--chunk-size", type=int, default=50, help="bulk chunk size (in-process uses this + 13)")
    args = parser.parse_args(argv)
    MarFile(args.archive).manifest()  # a missing or broken archive stops here, before any server starts
    rows = digit_rows(args.rows)
    modes = ["default", "deterministic"] if args.mode == "both" else [args.mode]
    ok = True
    with tempfile.TemporaryDirectory(prefix="verify-") as folder:
        for mode in modes:
            report = verify_mode(mode, args.archive, rows, Path(folder), args.chunk_size)
            print(report.text(), flush=True)
            ok = ok and not report.failures()
    return 0 if ok else 1


if __name__ == "__main__":
    cli.run(lambda: main())
