"""Run a dataset through the model: every row's result exactly once, in input order.

    python -m scripts.jobs.batch_job --model digits --input rows.jsonl --output results.jsonl
    python -m scripts.jobs.batch_job --model digits --input rows.parquet --output results.parquet --in-process
    python -m scripts.jobs.batch_job ... --resume        # continue a killed job where its output ends
    python -m scripts.jobs.batch_job ... --engine ray    # the in-process core in Ray actors (scripts/jobs/ray_runner.py)

Chunks of --chunk-size rows go as {"instances": [...]} to the `<model>-bulk` lane, --concurrency at a
time, or with --in-process through the same handler core loaded from model_store/<model>.mar. Writes
{"id": ..., "prediction": ...} per row; rows rejected on their own go to the errors file with the reason.
Exit status: 0 all rows predicted, 1 some rows in the errors file, 2 the job stopped (resumable).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from handlers.collector import PacedCollector
from handlers.core import torch_threads
from handlers.lane_signal import LaneSignal, device_name
from handlers.priority import enter_background
from handlers.yielding import YieldingPasses
from scripts import cli
from scripts.archive.core import load_core
from scripts.errors import ScriptError
from scripts.jobs.chunks import RetryPolicy, run_chunk
from scripts.jobs.inputs import FORMATS, Chunk, Row, open_input
from scripts.jobs.outputs import OutputPaths, Progress, ResultSink, default_errors_path
from scripts.jobs.prefetch import decode_chunk, predict_chunk, prefetched
from scripts.jobs.runners import InProcessRunner, JobError, ServerRunner
from scripts.layout import CONFIG, KEY_FILE, MODEL_STORE
from scripts.server.config import ServerConfig
from scripts.server.endpoints import Endpoints

EXIT_OK, EXIT_ROW_ERRORS, EXIT_STOPPED = 0, 1, 2
# In-process chunks read and decoded ahead, on the CPU as on CUDA: with the collector paced by chunk
# (handlers/collector.py) reading ahead pays (docs/decisions.md, "Batch jobs").
PREFETCH = 2
# Chunks in flight per forward worker: the writer waits for the oldest once more than this many per worker are
# submitted, so with 1 one chunk is queued behind the running passes when it waits. With 2 (three queued on 2 cores)
# the workers no longer wait while the writer commits, yet the job got no faster (docs/decisions.md): on 2 cores
# the writer and reader then preempt a busy pass instead of taking the core a waiting one leaves.
CHUNKS_PER_FORWARD_WORKER = 1
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class JobConfig:
    model: str
    input: Path
    output: Path
    errors: Path | None = None
    input_format: str | None = None
    in_process: bool = False
    archive: Path | None = None  # in-process: default model_store/<model>.mar
    lane: str | None = None  # server: default <model>-bulk
    resume: bool = False
    overwrite: bool = False
    chunk_size: int = 1000
    # Server: chunks in flight. Twice the bulk lanes' batchSize (4, config.properties): while the worker runs one
    # batch the next is already queued, so it never waits maxBatchDelay for chunks the job is still reading.
    concurrency: int = 8
    # In-process: chunks read and decoded ahead of the forward pass (0: one thread does all).
    prefetch: int = PREFETCH
    config: Path = CONFIG
    key_file: Path = KEY_FILE
    progress_bar: bool = True
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    engine: str = "local"  # ray: the archive's core in Ray actors, like --in-process
    actors: int | None = None  # ray: default one per GPU of the cluster, else one per CPU
    ray_address: str | None = None  # ray: default RAY_ADDRESS, else a local Ray
    # Ray's actors at idle priority (handlers/priority.py); the command (main) puts its own process there too, a
    # library caller keeps its own. False: the OS's fair share.
    background: bool = True

    def check(self) -> None:
        if self.chunk_size < 1:
            raise JobError(f"--chunk-size must be at least 1, got {self.chunk_size}")
        if self.concurrency < 1:
            raise JobError(f"--concurrency must be at least 1, got {self.concurrency}")
        if self.resume and self.overwrite:
            raise JobError("--resume and --overwrite contradict each other: pick one")
        if self.output.resolve() == self.input.resolve():
            raise JobError(f"--output {self.output} is the input itself: writing it would destroy the rows; pick another file")
        if self.prefetch < 0:
            raise JobError(f"--prefetch must be at least 0, got {self.prefetch}")
        if self.actors is not None and self.actors < 1:
            raise JobError(f"--actors must be at least 1, got {self.actors}")


@dataclass(frozen=True)
class JobSummary:
    runner: str
    total: int
    resumed_at: int
    predicted: int
    failed: int
    seconds: float
    output: Path
    errors: Path
    # Each request's seconds to its answer, for a job sent to a lane (ServerRunner.latencies); empty in process.
    request_seconds: tuple[float, ...] = ()

    @property
    def rows_per_second(self) -> float:
        return (self.total - self.resumed_at) / self.seconds if self.seconds > 0 else 0.0

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.failed == 0 else EXIT_ROW_ERRORS

    def text(self) -> str:
        lines = [
            f"{self.total} rows via {self.runner}: {self.predicted} predicted -> {self.output}",
            f"  {self.total - self.resumed_at} rows this run in {self.seconds:.1f}s ({self.rows_per_second:,.0f} rows/s)"
            + (f", resumed after row {self.resumed_at}" if self.resumed_at else ""),
        ]
        if self.failed:
            lines.append(f"  {self.failed} rows rejected -> {self.errors} (each line has the row, its id and the reason)")
        return "\n".join(lines)


def run_job(config: JobConfig) -> JobSummary:
    """Run (or resume) a job to its end; raises JobError/InputError/OutputError when it cannot go on."""
    config.check()
    workers = forward_workers(config)
    # Set before the core loads: an onnxruntime session takes torch's thread count when it is made.
    with torch_threads(1) if workers > 1 else contextlib.nullcontext():
        return _run_job(config, workers)


def forward_workers(config: JobConfig) -> int:
    """Forward passes run at once by an in-process job with prefetch: on the CPU one per torch thread (every core
    by default), each on one torch thread; on CUDA, with Ray or without prefetch, one.

    Two passes of one thread each instead of one of two: no OpenMP barrier for the reader's and writer's threads to
    stall when they take a core, nor a spinning thread beside them (docs/decisions.md, "Batch jobs")."""
    if not config.in_process or config.prefetch < 1 or config.engine == "ray" or torch.cuda.is_available():
        return 1
    return max(1, torch.get_num_threads())


def _run_job(config: JobConfig, workers: int) -> JobSummary:
    source = open_input(config.input, config.input_format)
    total = source.count()
    paths = OutputPaths(config.output, config.errors or default_errors_path(config.output))
    runner = _runner(config)
    if config.resume:
        sink = ResultSink.resume(paths, str(config.input.resolve()), config.model, total)
    else:
        sink = ResultSink.start(paths, Progress(str(config.input.resolve()), config.model, total), config.overwrite)
    resumed_at = sink.progress.rows_done
    started = time.perf_counter()
    # Collections between chunks, not every 700 allocations (handlers/collector.py); Ray's driver and actors keep
    # Python's own.
    collector = PacedCollector()
    try:
        with (
            collector if config.engine != "ray" else contextlib.nullcontext(),
            tqdm(
                total=total,
                initial=resumed_at,
                unit="rows",
                unit_scale=True,
                desc=config.model,
                disable=not config.progress_bar,
                smoothing=0.1,
            ) as bar,
        ):
            if config.engine == "ray":
                runner.pump(source, resumed_at, total, sink, bar)
            elif config.in_process and config.prefetch > 0:
                chunks = source.chunks(config.chunk_size, resumed_at)
                _pump_prefetched(runner, chunks, sink, bar, config.prefetch, collector, workers)
            else:
                rows = (chunk.rows_with_instances() for chunk in source.chunks(config.chunk_size, resumed_at))
                _pump(runner, rows, sink, bar, config, collector)
    finally:
        sink.close()
    sink.finish()
    seconds = time.perf_counter() - started
    done = sink.progress
    latencies = tuple(getattr(runner, "latencies", ()))
    return JobSummary(runner.name, total, resumed_at, done.predicted, done.failed, seconds, paths.output, paths.errors, latencies)


def _runner(config: JobConfig):
    archive = config.archive or MODEL_STORE / f"{config.model}.mar"
    if config.engine == "ray":
        from scripts.jobs.ray_runner import RayRunner  # Ray takes seconds to import: only for this engine

        return RayRunner(archive, config.chunk_size, config.retry, config.actors, config.ray_address, config.background)
    if config.in_process:
        core = load_core(archive)
        # The stream lanes of this host and device come first here too (handlers/yielding.py): on a GPU it waits while
        # they run a batch; on the CPU, where the OS preempts its idle threads, each forward thread keeps its passes
        # short and yields while they are busy, so that it never computes past a tick of the scheduler.
        on_cpu = core.device.type == "cpu"
        if config.background:
            full = core.settings.max_batch_rows * (1 if on_cpu else forward_workers(config))  # per calling thread
            core.yielding = YieldingPasses.for_lane(LaneSignal(device_name(core.device)), core.settings, full, on_cpu)
        return InProcessRunner(core, archive)
    endpoints = Endpoints.from_config(config.config, config.key_file)
    endpoints.token("inference")  # fail now, with the hint, if the server has not written its key file
    server = ServerConfig.read(config.config)
    lane = config.lane or f"{config.model}-bulk"
    return ServerRunner.for_lane(endpoints, server, lane, config.concurrency)


def _pump(runner, chunks: Iterator[list[Row]], sink: ResultSink, bar: tqdm, config: JobConfig, collector: PacedCollector) -> None:
    """Keep up to `concurrency` chunks in flight; commit them strictly in input order as they finish."""
    workers = 1 if config.in_process else config.concurrency
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chunk")
    in_flight: deque[Future] = deque()
    try:
        for chunk in chunks:
            in_flight.append(pool.submit(run_chunk, runner.send, chunk, config.retry))
            # One chunk more than the workers, so a worker never waits for the reader.
            while len(in_flight) > workers:
                _commit(in_flight.popleft(), sink, bar, collector)
        while in_flight:
            _commit(in_flight.popleft(), sink, bar, collector)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _pump_prefetched(
    runner: InProcessRunner,
    chunks: Iterator[Chunk],
    sink: ResultSink,
    bar: tqdm,
    depth: int,
    collector: PacedCollector,
    workers: int = 1,
) -> None:
    """In-process, as a pipeline (scripts/jobs/prefetch.py): a thread reads and decodes `depth` chunks ahead,
    `workers` threads run the forward passes (forward_workers), this thread writes; chunks are committed in input
    order."""
    core = runner.core
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="forward")
    in_flight: deque[Future] = deque()
    try:
        for chunk in prefetched(chunks, lambda chunk: decode_chunk(core, chunk), depth):
            in_flight.append(pool.submit(predict_chunk, core, chunk))
            while len(in_flight) > CHUNKS_PER_FORWARD_WORKER * workers:
                _commit(in_flight.popleft(), sink, bar, collector)
        while in_flight:
            _commit(in_flight.popleft(), sink, bar, collector)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _commit(future: Future, sink: ResultSink, bar: tqdm, collector: PacedCollector) -> None:
    results = future.result()
    sink.commit(results)
    bar.update(len(results))
    del results
    collector.tick()


def parse_args(argv: list[str] | None) -> JobConfig:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--model", required=True, help="model name: digits, minilm, ...")
    parser.add_argument("--input", required=True, type=Path, help=".jsonl, .csv, .parquet or a folder of images")
    parser.add_argument("--output", required=True, type=Path, help=".jsonl or .parquet")
    parser.add_argument("--errors", type=Path, help="rejected rows (default: <output stem>.errors.jsonl beside the output)")
    parser.add_argument("--input-format", choices=FORMATS, help="when the file name does not tell")
    parser.add_argument("--in-process", action="store_true", help="no server: run the handler core here")
    parser.add_argument("--archive", type=Path, help="with --in-process: the .mar to load (default model_store/<model>.mar)")
    parser.add_argument("--lane", help="server lane (default <model>-bulk)")
    parser.add_argument("--resume", action="store_true", help="continue the job that wrote --output")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    parser.add_argument("--chunk-size", type=int, default=JobConfig.chunk_size, help="rows per request (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=JobConfig.concurrency, help="requests in flight (default %(default)s)")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=JobConfig.prefetch,
        metavar="CHUNKS",
        help="--in-process: chunks read and decoded ahead while the core runs (default %(default)s; 0: one thread does all)",
    )
    parser.add_argument(
        "--retry-for",
        type=float,
        default=RetryPolicy.patience,
        metavar="SECONDS",
        help="retry a chunk the server fails (no answer, 5xx) for up to this long, then stop (default %(default)s)",
    )
    parser.add_argument(
        "--engine", choices=ENGINES, default="local", help="ray: run the core in Ray actors (--archive as in-process)"
    )
    parser.add_argument("--actors", type=int, help="--engine ray: actors (default one per GPU of the cluster, else per CPU)")
    parser.add_argument("--ray-address", help="--engine ray: the cluster (default as ray.init(): RAY_ADDRESS, else a local Ray)")
    parser.add_argument(
        "--normal-priority",
        action="store_true",
        help="run at the OS's normal priority (default: idle priority, taking only what live traffic leaves)",
    )
    cli.add_server_options(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    return JobConfig(
        model=args.model,
        input=args.input,
        output=args.output,
        errors=args.errors,
        input_format=args.input_format,
        in_process=args.in_process,
        archive=args.archive,
        lane=args.lane,
        resume=args.resume,
        overwrite=args.overwrite,
        chunk_size=args.chunk_size,
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        config=args.config,
        key_file=args.key_file,
        progress_bar=not args.no_progress,
        retry=RetryPolicy(patience=args.retry_for, notify=_print_retry),
        engine=args.engine,
        actors=args.actors,
        ray_address=args.ray_address,
        background=not args.normal_priority,
    )


def _print_retry(line: str) -> None:
    tqdm.write(f"retrying {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    if config.background:
        # Before the core loads and the pools start (the reader, the writer, torch's): their threads inherit it.
        enter_background()
    try:
        summary = run_job(config)
    except ScriptError as error:  # JobError, InputError, OutputError, a missing key file, ...
        print(f"batch job stopped: {error}", file=sys.stderr)
        return EXIT_STOPPED
    print(summary.text(), file=sys.stderr)
    return summary.exit_code


if __name__ == "__main__":
    cli.run(lambda: main())
