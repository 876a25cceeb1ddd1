"""A batch job on Ray Data (`batch_job --engine ray`): the same inputs, handler core, outputs and resume as in-process,
with the chunks spread over Ray actors, one per GPU of the cluster (or one per CPU where it has none).

- Reading: one Ray read task, pinned to the driver's node, runs the job's own readers (scripts/jobs/inputs.py) from
  the first uncommitted row and yields one block per chunk of --chunk-size rows. The same readers mean the same row
  numbers, default ids and unreadable-row errors as the local runners; only the driver's node reads the input.
- Inference: `map_batches` with a callable class: each actor loads the archive's InferenceCore once (runners.py
  load_core) and answers whole chunks through scripts/jobs/chunks.py, so a bad row is isolated exactly as in-process.
  Every node must be able to read the archive at the path the driver was given.
- Writing: Ray Data keeps the input order (preserve_order), and the driver commits each chunk through the same
  ResultSink as the local runners, so a killed job resumes with --resume (with or without Ray) where it stopped.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import psutil
import ray
from ray.data import ActorPoolStrategy, DataContext
from ray.util.placement_group import NODE_ID_LABEL_KEY
from tqdm import tqdm

from handlers.priority import enter_background
from scripts.archive.core import load_core
from scripts.jobs.chunks import RetryPolicy, run_chunk
from scripts.jobs.inputs import RowSource
from scripts.jobs.outputs import ResultSink
from scripts.jobs.ray_source import CHUNK, ChunkSource
from scripts.jobs.runners import InProcessRunner, JobError

RESULTS = "results"
# A chunk is one row of the dataset, and each block holds one row: any chunk can go to any actor, a chunk is never
# split (its micro-batches are the in-process runner's), and the driver commits chunk by chunk. Ray Data would
# otherwise pack rows into blocks of up to 128 MiB, and one block is one actor's task.
ONE_ROW_PER_BLOCK = 1


@dataclass(frozen=True)
class ActorPlan:
    """How many actors, and what each one reserves: a whole GPU, or one CPU."""

    actors: int
    num_gpus: int
    num_cpus: int

    @property
    def text(self) -> str:
        return f"{self.actors} actor{'s' if self.actors != 1 else ''} with one {'GPU' if self.num_gpus else 'CPU'} each"


def plan_actors(resources: dict[str, float], requested: int | None) -> ActorPlan:
    """One actor per GPU of the cluster, else one per CPU; `requested` (--actors) takes fewer."""
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    slots = gpus or cpus
    if slots < 1:
        raise JobError(f"the Ray cluster offers no GPU and no whole CPU for an actor (resources: {resources})")
    if requested is not None and requested > slots:
        raise JobError(f"--actors {requested} is more than the cluster's {slots} {'GPUs' if gpus else 'CPUs'}")
    return ActorPlan(requested or slots, num_gpus=1 if gpus else 0, num_cpus=1)


class ChunkPredictor:
    """A Ray actor: the archive's InferenceCore, loaded once; one chunk of Rows per call, answered as RowResults."""

    def __init__(self, archive: str, retry: RetryPolicy, background: bool = True) -> None:
        # Before the core loads: the actor's threads (Ray's own included) and torch's pool take what live traffic on
        # the node leaves (handlers/priority.py).
        self.threads_at_idle = enter_background() if background else 0
        self.runner = InProcessRunner(load_core(Path(archive)), Path(archive))
        self.retry = retry

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        results = [run_chunk(self.runner.send, list(chunk), self.retry) for chunk in batch[CHUNK]]
        return pd.DataFrame({RESULTS: pd.Series(results, dtype=object)})


@dataclass(frozen=True)
class RayRunner:
    archive: Path
    chunk_size: int
    retry: RetryPolicy
    actors: int | None = None  # None: one per GPU, else one per CPU
    address: str | None = None  # None: as ray.init() (RAY_ADDRESS, a `ray start` here, else a Ray of our own)
    background: bool = True  # the actors at idle priority (handlers/priority.py)

    @property
    def name(self) -> str:
        return f"Ray Data with {self.archive.name}"

    def pump(self, source: RowSource, skip: int, total: int, sink: ResultSink, bar: tqdm) -> None:
        """Run every row from `skip` on and commit them in input order, chunk by chunk."""
        if not self.archive.is_file():
            raise JobError(f"{self.archive} not found: build it with `make archive` (every Ray node reads it at this path)")
        started_here = not ray.is_initialized()
        if started_here:
            ray.init(address=self.address, include_dashboard=False, logging_level="WARNING")
        try:
            plan = plan_actors(ray.cluster_resources(), self.actors)
            bar.set_postfix_str(plan.text)
            self._commit_all(self._dataset(source, skip, total, plan), skip, sink, bar)
        except ray.exceptions.RayError as error:
            raise JobError(f"Ray stopped the job: {error}; the committed rows are saved: rerun with --resume") from None
        finally:
            if started_here:
                shutdown_local_ray()

    def _dataset(self, source: RowSource, skip: int, total: int, plan: ActorPlan) -> ray.data.Dataset:
        context = DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False
        context.target_max_block_size = ONE_ROW_PER_BLOCK
        # Rows and results are Python objects (ids and items of any JSON type): pickled, as Ray Data allows.
        context.enable_fallback_to_arrow_object_ext_type = True
        # The reader runs where the driver is (the input need not be on every node) and takes no CPU from the actors.
        chunks = ray.data.read_datasource(
            ChunkSource(source, skip, total, self.chunk_size),
            override_num_blocks=1,
            num_cpus=0,
            label_selector={NODE_ID_LABEL_KEY: ray.get_runtime_context().get_node_id()},
        )
        return chunks.map_batches(
            ChunkPredictor,
            fn_constructor_kwargs={"archive": str(self.archive.resolve()), "retry": self.retry, "background": self.background},
            batch_size=1,
            batch_format="pandas",
            compute=ActorPoolStrategy(size=plan.actors),
            num_gpus=plan.num_gpus,
            num_cpus=plan.num_cpus,
        )

    def _commit_all(self, dataset: ray.data.Dataset, skip: int, sink: ResultSink, bar: tqdm) -> None:
        expected = skip
        for batch in dataset.iter_batches(batch_size=None, batch_format="pandas"):
            for results in batch[RESULTS]:
                # Resume counts committed rows, so a row out of place would be lost or written twice: refuse it.
                if [result.row.index for result in results] != list(range(expected, expected + len(results))):
                    raise JobError(f"Ray Data returned rows out of input order after row {expected}")
                sink.commit(results)
                bar.update(len(results))
                expected += len(results)


def shutdown_local_ray(grace: float = 1.0) -> None:
    """ray.shutdown() of the Ray this process started, and its workers: left alone they outlive it (up to a minute
    on a busy machine) until they notice that their raylet is gone."""
    raylets = [child for child in psutil.Process().children(recursive=True) if child.name() == "raylet"]
    workers = [worker for raylet in raylets for worker in raylet.children(recursive=True)]
    ray.shutdown()
    for signal in ("terminate", "kill"):
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                getattr(worker, signal)()
        _, workers = psutil.wait_procs(workers, timeout=grace)
