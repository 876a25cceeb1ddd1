"""`make verify`: each model's samples through the three paths, proof that stream and batch agree.

    python -m scripts.verify.agreement                       # every model, both modes: as built, then deterministic
    python -m scripts.verify.agreement --model minilm --mode deterministic

For each model and mode a throwaway TorchServe serves the archive (free ports, temporary folder; `make serve`'s
server is not needed nor touched), and the model's samples (models/<name>/samples.json, repeated to --rows) go
through
  (a) stream:     one single-row request each to the stream lane, many at once, so TorchServe's
                  batcher mixes them into batches of varying make-up;
  (b) bulk:       a batch job to the bulk lane (chunks of --chunk-size rows, concurrent);
  (c) in-process: the same batch job through the handler core loaded from the same archive.
The report gives each path's agreement with the samples' answers (compared as samples.json says) and the largest
difference between any two paths' numbers. Deterministic mode (handler.deterministic: true, served from a copy of
the archive with only that setting changed) must make all three bitwise equal; the default mode may differ by float
rounding. Exits 1 when a check fails.
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

from models import registry
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

# Default mode: a row's numbers may move by float rounding when it shares a batch with other rows.
DEFAULT_TOLERANCE = 1e-5
STREAM_CLIENTS = 8


@dataclass(frozen=True)
class Rows:
    """The rows a verification sends: the model's samples repeated, each with the answer it must get."""

    samples: registry.Samples
    instances: list
    answers: list

    @classmethod
    def of(cls, model: str, count: int | None = None) -> Rows:
        samples = registry.model(model).samples()
        count = count or len(samples.instances)
        picks = [i % len(samples.instances) for i in range(count)]
        return cls(samples, [samples.instances[i] for i in picks], [samples.answers[i] for i in picks])


def numbers(prediction) -> list[float]:
    """Every number of one answer, in order (labels, scores, embeddings, probabilities): what the paths compare."""
    if isinstance(prediction, dict):
        return [n for key in sorted(prediction) for n in numbers(prediction[key])]
    if isinstance(prediction, list):
        return [n for item in prediction for n in numbers(item)]
    return [float(prediction)] if isinstance(prediction, (int, float)) and not isinstance(prediction, bool) else []


@dataclass(frozen=True)
class PathResult:
    name: str
    predictions: list
    note: str = ""

    @property
    def scores(self) -> np.ndarray:
        return np.array([numbers(prediction) for prediction in self.predictions])

    def agreement(self, rows: Rows) -> float:
        agreeing = [rows.samples.problem(p, a) is None for p, a in zip(self.predictions, rows.answers, strict=True)]
        return sum(agreeing) / len(agreeing)


@dataclass(frozen=True)
class ModeReport:
    mode: str
    max_batch_rows: int
    rows: Rows
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
        least = self.rows.samples.min_agreement
        for path in self.paths:
            if path.agreement(self.rows) < least:
                problems.append(
                    f"{path.name}: {path.agreement(self.rows):.4f} of the samples answered as expected, under {least}"
                )
        return problems

    def text(self) -> str:
        padding = f", every micro-batch padded to {self.max_batch_rows} rows" if self.deterministic else ""
        lines = [
            f"mode: {self.mode} "
            f"(handler.deterministic: {str(self.deterministic).lower()}, max_batch_rows={self.max_batch_rows}{padding})",
            f"model {self.rows.samples.model}: {len(self.rows.instances)} rows of its samples",
        ]
        for path in self.paths:
            lines.append(f"  {path.name:<11} agreement {path.agreement(self.rows):.4f}  {path.note}")
        for (a, b), difference in self.differences().items():
            lines.append(f"  max |difference| {a} vs {b}: {difference:.3g}" + (" (bitwise equal)" if difference == 0 else ""))
        problems = self.failures()
        lines.append("PASS" if not problems else "FAIL: " + "; ".join(problems))
        return "\n".join(lines)


def verify_mode(mode: str, archive: Path, rows: Rows, workdir: Path, chunk_size: int) -> ModeReport:
    model = rows.samples.model
    found = registry.model(model)
    variant = workdir / f"{model}-{mode}.mar"
    served = archive if mode == "default" else write_variant(archive, variant, {"deterministic": True})
    settings = MarFile(served).settings()
    if settings.deterministic != (mode == "deterministic"):
        raise ScriptError(f"{archive} already has handler.deterministic: {settings.deterministic}; pass a default archive")
    job_input = workdir / f"{model}-samples.jsonl"
    job_input.write_bytes(b"".join(orjson.dumps({"id": i, "instance": x}) + b"\n" for i, x in enumerate(rows.instances)))
    job = {"model": model, "input": job_input, "progress_bar": False, "overwrite": True}
    with temporary_server(served, name=f"{model}.mar") as server:
        stream = stream_path(server.endpoints, found.stream_lane.name, rows)
        bulk = job_path(
            "bulk",
            JobConfig(
                **job,
                output=workdir / f"{model}-{mode}-bulk.jsonl",
                chunk_size=chunk_size,
                config=server.config,
                key_file=server.endpoints.key_file,
            ),
        )
    # A different chunk size again: one more batch make-up for the same rows.
    in_process = job_path(
        "in-process",
        JobConfig(
            **job,
            output=workdir / f"{model}-{mode}-in-process.jsonl",
            chunk_size=chunk_size + 13,
            in_process=True,
            archive=served,
        ),
    )
    return ModeReport(mode, settings.max_batch_rows, rows, [stream, bulk, in_process])


def stream_path(endpoints: Endpoints, lane: str, rows: Rows) -> PathResult:
    """One request per row to the stream lane, from several clients at once."""
    bodies = [orjson.dumps({"instances": [instance]}) for instance in rows.instances]
    started = time.perf_counter()
    answers = send_concurrently(endpoints, lane, bodies, [JSON] * len(bodies), STREAM_CLIENTS)
    seconds = time.perf_counter() - started
    refused = [answer.reply for answer in answers if answer.reply.status_code != 200]
    if refused:
        raise ScriptError(
            f"{len(refused)} stream requests failed, the first: HTTP {refused[0].status_code} {refused[0].text[:200]}"
        )
    sizes = dict(sorted(collections.Counter(answer.batch_requests for answer in answers).items()))
    note = f"{len(answers)} single-row requests from {STREAM_CLIENTS} clients in {seconds:.1f}s"
    note += f"; requests by handler-call size {sizes}"
    return PathResult("stream", [answer.reply.json()["predictions"][0] for answer in answers], note)


def job_path(name: str, config: JobConfig) -> PathResult:
    summary = run_job(config)
    if summary.failed:
        raise ScriptError(f"{name} job rejected {summary.failed} sample rows; see {summary.errors}")
    records = read_results(config.output)
    return PathResult(
        name,
        [r["prediction"] for r in records],
        f"batch job, chunks of {config.chunk_size} rows, {summary.predicted} results in {summary.seconds:.1f}s",
    )


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--model", choices=list(registry.models()), help="one model (default: every model)")
    parser.add_argument("--mode", choices=["default", "deterministic", "both"], default="both")
    parser.add_argument("--archive", type=Path, help="with --model: the archive (default model_store/<model>.mar)")
    parser.add_argument("--rows", type=int, default=120, help="rows per model: its samples, repeated (default %(default)s)")
    parser.add_argument("--chunk-size", type=int, default=25, help="bulk chunk size (in-process uses this + 13)")
    args = parser.parse_args(argv)
    names = [args.model] if args.model else list(registry.models())
    archives = {name: (args.archive if args.model and args.archive else MODEL_STORE / f"{name}.mar") for name in names}
    for archive in archives.values():
        MarFile(archive).manifest()  # a missing or broken archive stops here, before any server starts
    modes = ["default", "deterministic"] if args.mode == "both" else [args.mode]
    ok = True
    with tempfile.TemporaryDirectory(prefix="verify-") as folder:
        for name, archive in archives.items():
            for mode in modes:
                report = verify_mode(mode, archive, Rows.of(name, args.rows), Path(folder), args.chunk_size)
                print(report.text(), flush=True)
                ok = ok and not report.failures()
    return 0 if ok else 1


if __name__ == "__main__":
    cli.run(lambda: main())
