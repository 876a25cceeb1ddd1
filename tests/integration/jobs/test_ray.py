"""`batch_job --engine ray` on a real local Ray (2 CPUs, so 2 actors): the held-out digits, two bad rows among
them, resumed by Ray after a job that stopped, give byte for byte the in-process runner's output and errors files.
In the deterministic mode (the archive's deterministic copy): Ray's actors run torch with one thread, the in-process
runner here with every core, and only that mode makes scores independent of it. (The default mode's files were
byte-equal as well in a run on this machine, but nothing promises it.)"""

from __future__ import annotations

import orjson
import pytest
import ray

from models.digits.samples import digit_rows, write_jsonl
from scripts.archive.variant import write_variant
from scripts.jobs.batch_job import JobConfig, run_job
from scripts.jobs.outputs import ResultSink, read_results
from scripts.jobs.ray_runner import ActorPlan, plan_actors, shutdown_local_ray
from scripts.jobs.runners import JobError
from scripts.layout import MODEL_STORE

ROWS = digit_rows()  # the 360 held-out digits
CHUNK = 40


class Stopped(Exception):
    """The first run's end, as a kill would leave it: some chunks committed, the rest not."""


@pytest.fixture(scope="module")
def local_ray():
    # A Ray of its own ("local"), even if `ray start` left one running on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        shutdown_local_ray()


@pytest.fixture(scope="module")
def deterministic_archive(tmp_path_factory):
    return write_variant(
        MODEL_STORE / "digits.mar", tmp_path_factory.mktemp("ray") / "digits-deterministic.mar", {"deterministic": True}
    )


def job(source, output, archive, **changes) -> JobConfig:
    return JobConfig(
        model="digits",
        input=source,
        output=output,
        archive=archive,
        in_process=True,
        chunk_size=CHUNK,
        progress_bar=False,
        **changes,
    )


def stop_after(commits: int, monkeypatch) -> None:
    commit = ResultSink.commit
    done = []

    def counted(sink, results):
        if len(done) == commits:
            raise Stopped
        commit(sink, results)
        done.append(len(results))

    monkeypatch.setattr(ResultSink, "commit", counted)


def test_ray_resumes_a_stopped_job_and_writes_exactly_the_in_process_runners_files(
    local_ray, deterministic_archive, tmp_path, monkeypatch
):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    lines = source.read_bytes().splitlines()
    lines[200] = orjson.dumps({"id": "out-of-range", "instance": [99] * 64})
    lines[301] = b'{"id": "cut", "instance": [0, 0'
    source.write_bytes(b"\n".join(lines) + b"\n")

    reference = run_job(job(source, tmp_path / "local.jsonl", deterministic_archive))
    assert (reference.predicted, reference.failed) == (358, 2)

    stop_after(1, monkeypatch)
    with pytest.raises(Stopped):
        run_job(job(source, tmp_path / "ray.jsonl", deterministic_archive))
    monkeypatch.undo()
    resumed = run_job(job(source, tmp_path / "ray.jsonl", deterministic_archive, engine="ray", resume=True))

    assert resumed.runner.startswith("Ray Data")
    assert (resumed.resumed_at, resumed.predicted, resumed.failed) == (CHUNK, 358, 2)
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "local.jsonl").read_bytes()
    assert (tmp_path / "ray.errors.jsonl").read_bytes() == (tmp_path / "local.errors.jsonl").read_bytes()
    results = read_results(tmp_path / "ray.jsonl")
    assert [r["id"] for r in results] == [f"digit-{n}" for n in range(360) if n not in (200, 301)]
    errors = [orjson.loads(line) for line in (tmp_path / "ray.errors.jsonl").read_bytes().splitlines()]
    assert [(e["id"], e["row"], e["error"]["code"]) for e in errors] == [("out-of-range", 201, 400), (302, 302, 400)]
    labels = [label for n, label in enumerate(ROWS.labels) if n not in (200, 301)]
    accuracy = sum(r["prediction"]["label"] == label for r, label in zip(results, labels, strict=True)) / len(labels)
    assert accuracy >= 0.97


def test_one_actor_per_gpu_of_the_cluster_else_per_cpu():
    assert plan_actors({"CPU": 64.0, "GPU": 8.0}, None) == ActorPlan(8, num_gpus=1, num_cpus=1)
    assert plan_actors({"CPU": 2.0}, None) == ActorPlan(2, num_gpus=0, num_cpus=1)
    assert plan_actors({"CPU": 64.0, "GPU": 8.0}, 3) == ActorPlan(3, num_gpus=1, num_cpus=1)
    with pytest.raises(JobError, match="--actors 9 is more than the cluster's 8 GPUs"):
        plan_actors({"CPU": 64.0, "GPU": 8.0}, 9)
    with pytest.raises(JobError, match="no GPU and no whole CPU"):
        plan_actors({"CPU": 0.5}, None)
