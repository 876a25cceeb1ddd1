"""The GPU check's and the prepared device calls' pieces that run anywhere, for every model in models/: what travels
(models/<name>/portable.py) rebuilds an archive that answers the model's samples, the check agrees with this CPU on
every model and names a row that does not, and minilm's pruned vocabulary keeps every token the device sends."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from models import registry
from models.portable import of
from scripts.archive.reader import MarFile
from scripts.gpu import bundle, device_run
from scripts.gpu import models as gpu_models
from scripts.gpu.check import Budget, Check, Report
from scripts.layout import ROOT
from tests.model_params import first_fast_others_slow

NAMES = list(registry.models())


@pytest.fixture(scope="module")
def carried(tmp_path_factory):
    """What `make gpu-check-bundle` writes (CPU answers included) for every model, with the samples kept by a pruning
    model as `make gpu-device-prep` keeps them."""
    out = tmp_path_factory.mktemp("gpu-bundle")
    for name in NAMES:
        bundle.write_model(name, out, registry.model(name).samples().instances)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_model_declares_how_it_travels(name):
    portable = of(name)
    assert portable.name == name
    assert f"{portable.stem}.pt2" == registry.model(name).handler_config()["handler"]["model_file"]
    for precision in ("fp32", "bf16", "fp16"):  # a match in samples.json's own format
        assert set(portable.agreement[precision]) - {"min_agreement"} <= set(registry.MATCHERS)
    inputs, axes = portable.example(torch.device("cpu"))
    assert len(inputs) == len(axes) == len(portable.input_names)
    assert all(axis[0].max == portable.max_batch for axis in axes)  # the batch axis, as archive.py exports it


@pytest.mark.parametrize("name", first_fast_others_slow(NAMES))
def test_an_assembled_archive_carries_the_working_trees_handlers_and_answers_the_samples(name, carried, tmp_path, monkeypatch):
    monkeypatch.setattr(device_run, "WORK", tmp_path)
    archive, _ = device_run.assemble(name, carried / name)
    assert MarFile(archive).recorded_digest() == MarFile(archive).sha256()
    with zipfile.ZipFile(archive) as mar:
        assert mar.read("handlers/cuda_graphs.py") == (ROOT / "handlers" / "cuda_graphs.py").read_bytes()
        assert mar.read("torchserve_handler.py") == (ROOT / "handlers" / "torchserve" / "torchserve_handler.py").read_bytes()
        assert registry.model(name).handler_config()["handler"]["model_file"] in mar.namelist()
    stream = registry.model(name).stream_lane.name
    graphs = device_run.variant(archive, "graphs", {"cuda_graphs": {f"{stream}-graphs": True, "default": False}})
    assert MarFile(graphs).settings().device.graphs_for(f"{stream}-graphs")
    samples = registry.model(name).samples()
    served = gpu_models.answers(device_run.core_of(graphs), samples.instances)
    problems = [samples.problem(a, b) for a, b in zip(served, samples.answers, strict=True)]
    agreeing = sum(problem is None for problem in problems)
    assert agreeing >= samples.min_agreement * len(problems), [p for p in problems if p]


@pytest.mark.parametrize("name", first_fast_others_slow(NAMES))
def test_the_check_agrees_with_this_cpu_on_every_model(name, carried, tmp_path):
    report = Report(tmp_path / "out")
    check = Check(carried, tmp_path / "work", torch.device("cpu"), Budget(600), report, [name])
    check.formats = ("export",)
    check.reserve_s = 0
    check.agreement()
    rows = report.data["agreement"]
    assert {(row["model"], row["precision"]) for row in rows} == {(name, p) for p in ("fp32", "bf16")}
    for row in rows:
        assert row["within_bounds"], row
        assert row["to_cpu"]["rows"] == len(json.loads((carried / row["model"] / bundle.ITEMS).read_text()))
        # fp32 on the same CPU and weights is the same arithmetic: the bundle's answers to the last digit
        if row["precision"] == "fp32":
            assert row["to_bundle_cpu"]["largest_difference"] < 1e-5
        else:  # bf16 really ran (a label may differ where the model's bf16 match leaves a share of rows)
            assert row["to_cpu"]["largest_difference"] > 0
            assert row["to_cpu"]["rows_outside"] <= 0.1 * row["to_cpu"]["rows"]
    assert report.data["failures"] == []


@pytest.mark.parametrize("name", NAMES)
def test_a_row_outside_the_match_is_named(name, carried):
    reference = json.loads((carried / name / bundle.REFERENCE).read_text())
    served = json.loads(json.dumps(reference))
    portable = of(name)
    assert gpu_models.compare(portable, "fp32", served, reference)["within"]

    def nudge(value, by):
        if isinstance(value, float):
            return value + by
        if isinstance(value, list):
            return [nudge(v, by * (1 if i % 2 else -1)) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: nudge(v, by) if k not in ("index", "label") else v for k, v in value.items()}
        return value

    served[1] = nudge(served[1], 0.05)
    figures = gpu_models.compare(portable, "fp32", served, reference)
    assert not figures["within"] and figures["rows_outside"] == 1
    assert figures["first_outside"].startswith("row 1: ")


def test_the_pruned_vocabulary_keeps_every_token_of_the_device_inputs(carried):
    from tokenizers import Tokenizer

    from models.minilm.portable import used_token_ids

    tokenizer = carried / "minilm" / bundle.ARCHIVE_FILES / "tokenizer.json"
    texts = [*of("minilm").items(), *registry.model("minilm").samples().instances, of("minilm").long_item()]
    kept = set(json.loads((carried / "minilm" / "kept_ids.json").read_text()))
    assert used_token_ids(tokenizer, texts) == kept
    encoded = Tokenizer.from_file(str(tokenizer)).encode_batch(texts)
    assert {token for encoding in encoded for token in encoding.ids} <= kept
    assert {0, 100, 101, 102} <= kept  # [PAD], [UNK], [CLS], [SEP]
    assert len(kept) < 4000  # of 30,522: the rest are zeros in what travels


def test_the_speed_part_times_every_case_the_cpu_allows(carried, tmp_path):
    report = Report(tmp_path / "out")
    check = Check(carried, tmp_path / "work", torch.device("cpu"), Budget(600), report, ["digits"])
    check.formats, check.batch_sizes = ("export",), (1, 8)
    check.reserve_s = 0
    check.agreement()
    check.speed()
    [rates, overlap] = report.data["speed"]
    assert rates["model"] == "digits" and all(rate > 0 for rate in rates["rows_per_s"].values())
    assert overlap["serial_rows_per_s"] > 0 and overlap["overlapped_rows_per_s"] > 0


def test_a_device_figure_refuses_to_time_a_refused_request(carried, tmp_path, monkeypatch):
    monkeypatch.setattr(device_run, "WORK", tmp_path)
    monkeypatch.setattr(device_run, "CARRIED", carried)
    archive, _ = device_run.assemble("digits", carried / "digits")
    core = device_run.core_of(archive)
    request = device_run.payload("digits", 3)
    assert request.items[0] == registry.model("digits").samples().instances[registry.model("digits").bench["request"]]
    assert len(request.items) == 3
    device_run.answered(core, request)()  # answered 200: timed
    with pytest.raises(device_run.ScriptError, match="answered 400"):
        device_run.answered(core, device_run.Payload(items=[[1, 2, 3]], raw=False))
