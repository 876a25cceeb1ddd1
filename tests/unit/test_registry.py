"""models/registry.py: each model is its folder; what others read from it, and what `make archive` refuses."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from models import registry
from scripts.archive import build as archive_build
from scripts.errors import ArchiveError
from scripts.layout import CONFIG, MODEL_STORE


def copy_of(name: str, root: Path) -> Path:
    folder = root / name
    shutil.copytree(registry.HERE / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_every_folder_with_a_model_yaml_is_a_model_with_a_stream_lane_named_after_it():
    found = registry.models()
    assert list(found) == sorted(p.parent.name for p in registry.HERE.glob("*/model.yaml"))
    assert {"digits", "minilm"} <= set(found)
    for name, model in found.items():
        assert model.stream_lane.name == name and model.stream_lane.role == registry.STREAM
        assert model.bulk_lane is None or model.bulk_lane.name == f"{name}-bulk"
        assert registry.check(model) == []
        assert len(model.samples().instances) == len(model.samples().answers) >= 1


def test_config_properties_loads_exactly_the_lanes_the_folders_declare():
    # `make archive` writes these lines; a commit that changed a folder without them fails here.
    assert registry.properties_block() in CONFIG.read_text(), "config.properties is stale: run `make archive`"
    digits = registry.model("digits").stream_lane
    assert digits.torchserve_entry() == {
        "1.0": {
            "marName": "digits.mar",
            "minWorkers": 2,
            "maxWorkers": 2,
            "batchSize": 32,
            "maxBatchDelay": 1,
            "responseTimeout": 30,
        }
    }
    assert registry.load_models_value().split(",")[:2] == ["digits=digits.mar", "digits-bulk=digits.mar"]


def test_the_alerts_hold_each_stream_lanes_objective_from_its_folder():
    alerts = (CONFIG.parent / "monitoring" / "alerts.yml").read_text()
    assert registry.objectives_block() in alerts, "monitoring/alerts.yml is stale: run `make archive`"
    assert 'label_replace(vector(0.25), "lane", "digits", "", "")' in registry.objectives_block()
    assert all((lane.p99_objective_s is None) == lane.bulk for lane in registry.lanes())


def test_rewriting_the_properties_replaces_only_the_lanes(tmp_path):
    stale = tmp_path / "config.properties"
    text = CONFIG.read_text()
    stale.write_text(text.replace('"batchSize": 32', '"batchSize": 8'))
    assert registry.rewrite_properties(stale) is True
    assert stale.read_text() == text
    assert registry.rewrite_properties(stale) is False


def test_a_per_lane_key_for_a_lane_the_folder_does_not_declare_is_named_with_the_lanes(tmp_path):
    folder = copy_of("digits", tmp_path)
    config = folder / "model-config.yaml"
    config.write_text(config.read_text().replace("    digits-bulk: 200000", "    digit-bulk: 200000"))
    [problem] = registry.check(registry.discover(tmp_path)["digits"])
    assert "handler.max_request_rows names lane(s) digit-bulk" in problem
    assert "the lanes are digits, digits-bulk (or `default` for every lane not named)" in problem


def test_a_model_without_samples_is_refused_with_the_command_that_writes_them(tmp_path):
    folder = copy_of("minilm", tmp_path)
    (folder / registry.SAMPLES_FILE).unlink()
    [problem] = registry.check(registry.discover(tmp_path)["minilm"])
    assert "samples.json is missing" in problem and "python -m models.minilm.samples writes it" in problem


@pytest.mark.parametrize(
    "lanes, message",
    [
        (
            "  digits-bulk: {workers: 1, batch_size: 4, max_batch_delay_ms: 50, response_timeout_s: 300, worker_peak_mib: 9}",
            "no stream lane",
        ),
        (
            "  digits: {workers: 2, batch_size: 32, max_batch_delay_ms: 1, response_timeout_s: 30, p99_objective_s: 1}",
            "lacks worker_peak_mib",
        ),
        (
            "  digits: {workers: 2, batch_size: 32, max_batch_delay_ms: 1, response_timeout_s: 30, worker_peak_mib: 9}",
            "lane digits lacks p99_objective_s",
        ),
        (
            "  digits: {workers: 0, batch_size: 32, max_batch_delay_ms: 1, response_timeout_s: 30, worker_peak_mib: 9, "
            "p99_objective_s: 1}",
            "lanes.digits.workers must be a positive integer, got 0",
        ),
        (
            "  digits: {workers: 1, batch_size: 1, max_batch_delay_ms: 1, response_timeout_s: 1, worker_peak_mib: 9, "
            "p99_objective_s: 1}\n"
            "  digits-batch: {workers: 1, batch_size: 1, max_batch_delay_ms: 1, response_timeout_s: 1, worker_peak_mib: 9}",
            "lane 'digits-batch' is neither digits (stream) nor digits-bulk (bulk)",
        ),
    ],
)
def test_a_model_yaml_that_contradicts_the_layout_is_refused_naming_the_key(tmp_path, lanes, message):
    folder = copy_of("digits", tmp_path)
    (folder / registry.MODEL_FILE).write_text(f"lanes:\n{lanes}\n")
    with pytest.raises(registry.RegistryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        registry.discover(tmp_path)


LANE = (
    "  digits: {workers: 1, batch_size: 1, max_batch_delay_ms: 1, response_timeout_s: 1, worker_peak_mib: 9, p99_objective_s: 1}"
)


@pytest.mark.parametrize(
    ("bench", "message"),
    [
        ("bench:\n  peer: {flask: 1}", "bench: takes field_goals, job, peers, request, stream_goals only"),
        ("bench:\n  stream_goals: {p99_top: 40}", "bench.stream_goals maps goals to numbers; unknown or not a number: p99_top"),
        ("bench:\n  peers: {flask: -1}", "bench.peers maps a peer's key to an index into its candidates"),
        ("bench:\n  request: first", "bench.request is the index of a sample in samples.json"),
        ("bench:\n  job: {rows_per_s: 0}", "bench.job takes rows_per_s, chunk_size only, each a positive integer"),
        ("soak: {connection: 2}", "soak: takes connections, job_rows only, each a positive integer"),
        ("soak: {job_rows: many}", "soak: takes connections, job_rows only, each a positive integer"),
    ],
)
def test_a_bench_key_that_cannot_be_read_is_refused_naming_it(tmp_path, bench, message):
    folder = copy_of("digits", tmp_path)
    (folder / registry.MODEL_FILE).write_text(f"lanes:\n{LANE}\n{bench}\n")
    with pytest.raises(registry.RegistryError, match=message):
        registry.discover(tmp_path)


def test_bench_job_and_soak_take_their_defaults_where_a_folder_leaves_them_out(tmp_path):
    folder = copy_of("digits", tmp_path)
    (folder / registry.MODEL_FILE).write_text(f"lanes:\n{LANE}\nbench:\n  job: {{chunk_size: 8}}\n")
    found = registry.discover(tmp_path)["digits"]
    assert found.bench["job"] == {**registry.JOB_DEFAULTS, "chunk_size": 8}
    assert found.soak == registry.SOAK_DEFAULTS


def test_a_bench_request_past_the_samples_is_a_problem_with_their_count(tmp_path):
    folder = copy_of("minilm", tmp_path)
    text = (folder / registry.MODEL_FILE).read_text().replace("request: 9", "request: 16")
    (folder / registry.MODEL_FILE).write_text(text)
    (found,) = registry.discover(tmp_path).values()
    assert found.bench["peers"] == {"flask": 1, "litserve": 4, "ray": 1, "bentoml": 3, "pytriton": 0}
    assert found.bench["request"] == 16
    assert any("bench.request is 16, but samples.json holds 16 samples (0..15)" in p for p in registry.check(found))


def test_unknown_models_and_lanes_are_named_with_the_known_ones():
    names, lanes = ", ".join(registry.models()), ", ".join(lane.name for lane in registry.lanes())
    with pytest.raises(registry.RegistryError) as unknown:
        registry.model("digit")
    assert str(unknown.value).startswith(f"unknown model 'digit'; the models are {names} (a model is a folder")
    with pytest.raises(registry.RegistryError) as unserved:
        registry.lane("digits-batch")
    assert str(unserved.value) == f"no model serves lane 'digits-batch'; the lanes are {lanes}"
    assert "digits, digits-bulk" in lanes


def test_answers_are_compared_as_the_samples_say():
    samples = registry.Samples(
        "m", ("x",), ({},), {"equal": ["label", "top.*.index"], "close": {"score": 1e-4}, "cosine": {"vector": 0.99}}, 1.0
    )
    answer = {"label": 3, "top": [{"index": 3}, {"index": 5}], "score": 0.5, "vector": [1.0, 0.0]}
    assert samples.problem(answer, answer) is None
    assert samples.problem({**answer, "score": 0.50005, "vector": [0.99, 0.01]}, answer) is None
    assert samples.problem({**answer, "label": 4}, answer) == "label is 4, expected 3"
    assert samples.problem({**answer, "top": [{"index": 5}, {"index": 3}]}, answer) == "top.*.index is [5, 3], expected [3, 5]"
    assert "score is 0.6, expected 0.5 within 0.0001" == samples.problem({**answer, "score": 0.6}, answer)
    assert "vector has cosine 0.0000" in samples.problem({**answer, "vector": [0.0, 1.0]}, answer)
    assert samples.problem({"code": 400, "message": "bad"}, answer).startswith("no label in")
    assert samples.request(3) == ["x", "x", "x"]


def built(name: str, tmp_path: Path) -> Path:
    archive = MODEL_STORE / f"{name}.mar"
    if not archive.exists():
        pytest.skip(f"{archive} is built by `make archive` (make test builds it first)")
    for suffix in ("", ".sha256"):
        shutil.copy(f"{archive}{suffix}", tmp_path / f"{name}.mar{suffix}")
    return tmp_path / f"{name}.mar"


def test_an_archive_that_answers_its_samples_otherwise_is_removed_with_the_fix(tmp_path, monkeypatch):
    archive = built("digits", tmp_path)
    samples = registry.model("digits").samples()
    agreeing, problems = archive_build.sample_disagreements(archive, samples)
    assert agreeing >= samples.min_agreement * len(samples.instances) and len(problems) == len(samples.instances) - agreeing
    # The same archive against answers shifted by one label: almost none agree.
    wrong = registry.Samples(
        "digits", samples.instances, tuple({"label": (a["label"] + 1) % 10} for a in samples.answers), samples.match, 0.95
    )
    monkeypatch.setattr(registry, "model", lambda name: type("Found", (), {"samples": lambda self: wrong})())
    with pytest.raises(ArchiveError) as refused:
        archive_build.check_samples(archive, "digits")
    message = str(refused.value)
    assert "samples as models/digits/samples.json says (needs 95%), so it was removed" in message
    assert "sample 0: label is" in message and "python -m models.digits.samples" in message
    assert not archive.exists() and not Path(f"{archive}.sha256").exists()


def test_make_archive_refuses_a_folder_that_contradicts_itself_before_building(tmp_path, monkeypatch):
    folder = copy_of("digits", tmp_path)
    config = folder / "model-config.yaml"
    config.write_text(config.read_text().replace("    digits-bulk: 67108864", "    digits_bulk: 67108864"))
    monkeypatch.setattr(registry, "models", lambda: registry.discover(tmp_path))
    with pytest.raises(
        ArchiveError, match=r"models/digits contradicts itself:\n  .*handler.max_request_bytes names lane\(s\) digits_bulk"
    ):
        archive_build.build("digits", "1.0", tmp_path / "store", tmp_path / "build")
    assert not (tmp_path / "store").exists()


def test_the_committed_samples_are_what_each_models_reference_gives():
    from models.digits.samples import SAMPLE_ROWS, digit_rows
    from models.minilm.samples import SAMPLE_SENTENCES, reference_embeddings

    digits, rows = registry.model("digits").samples(), digit_rows(SAMPLE_ROWS)
    assert list(digits.instances) == rows.instances and [a["label"] for a in digits.answers] == rows.labels
    minilm = registry.model("minilm").samples()
    assert list(minilm.instances) == SAMPLE_SENTENCES
    reference = reference_embeddings(SAMPLE_SENTENCES)
    served = [answer["embedding"] for answer in minilm.answers]
    assert abs(np.asarray(served) - reference).max() < 1e-6  # written rounded to 6 decimals
