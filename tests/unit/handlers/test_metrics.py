"""The handler's metrics: declared in monitoring/metrics.yaml exactly as emitted, one line per series and batch,
labelled by model and lane; one debug line per batch and nothing per row at info level."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
import ts
import yaml
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.metrics.metric_type_enum import MetricTypes

from handlers.core import Response, StageTimes
from handlers.errors import SettingsError
from handlers.torchserve import metrics
from models.digits.samples import grid_png, held_out
from scripts.layout import ROOT
from tests.unit.handlers.test_torchserve_handler import MODULE, make_context

METRICS_YAML = ROOT / "monitoring" / "metrics.yaml"


def declared(section: str) -> dict:
    return yaml.safe_load(METRICS_YAML.read_text())[section]


def test_metrics_yaml_declares_exactly_the_metrics_the_handler_emits():
    in_yaml = {
        (metric["name"], MetricTypes(kind), metric["unit"], tuple(metric["dimensions"]))
        for kind, entries in declared("model_metrics").items()
        for metric in entries
    }
    assert in_yaml == {(spec.name, spec.type, spec.unit, spec.dimensions) for spec in metrics.METRICS}


def test_metrics_yaml_keeps_torchserves_own_metrics():
    # A metrics config replaces TorchServe's default file whole: its frontend metrics must be carried over.
    default = yaml.safe_load((Path(ts.__file__).parent / "configs" / "metrics.yaml").read_text())
    assert declared("ts_metrics") == default["ts_metrics"]


def test_the_server_config_ships_the_metrics_yaml_and_exports_only_declared_metrics():
    from scripts.server.config import ServerConfig

    config = ServerConfig.read()
    assert config.metrics_config == METRICS_YAML
    assert config.get("metrics_mode", "") == "prometheus"
    assert config.get("model_metrics_auto_detect", "") == "false"


def emitted(caplog) -> list[tuple[str, float, dict[str, str]]]:
    return emitted_lines(caplog.messages)


def emitted_lines(messages: list[str]) -> list[tuple[str, float, dict[str, str]]]:
    """The worker's metric lines, `[METRICS]Name.Unit:value|#dim:value,...|#type:...`, as (name, value, dims)."""
    lines = []
    for message in (line for record in messages for line in record.splitlines()):  # a batch's lines: one record
        if not message.startswith("[METRICS]"):
            continue  # e.g. the handler's warning line per failed request
        head, dimensions = message.removeprefix("[METRICS]").split("|")[:2]
        name, value = head.split(":")
        dims = dict(pair.split(":") for pair in dimensions.removeprefix("#").split(","))
        lines.append((name.split(".")[0], float(value), dims))
    return lines


@pytest.fixture(scope="module")
def handler(digits_model_dir):
    handler = MODULE.UnifiedHandler()
    handler.initialize(make_context(digits_model_dir, 0))
    return handler


def test_one_batch_emits_each_series_once_labelled_by_model_and_lane(handler, digits_model_dir, caplog):
    grids, _ = held_out(5)
    data = [
        {"body": {"instances": [g.tolist() for g in grids]}},
        {"body": bytearray(grid_png(grids[0]))},
        {"body": {"instances": [[0] * 10]}},
        {"data": b""},
    ]
    context = make_context(digits_model_dir, len(data))
    with caplog.at_level(logging.INFO, logger="ts.metrics.caching_metric"):
        handler.handle(data, context)
    lines = emitted(caplog)
    names = [name for name, _, _ in lines]
    per_batch = ["HandlerBatchRequests", "HandlerBatchRows", "HandlerLatencySeconds", "HandlerDecodeSeconds"]
    per_batch += ["HandlerCollateSeconds", "HandlerForwardSeconds", "HandlerEncodeSeconds", "HandlerForwardRows", "HandlerErrors"]
    assert sorted(names) == sorted(per_batch)  # CPU: no GPU gauges; no out-of-memory, so no split counter
    values = {name: value for name, value, _ in lines}
    assert values["HandlerBatchRequests"] == 4 and values["HandlerBatchRows"] == 6 and values["HandlerForwardRows"] == 6
    stages = sum(values[f"Handler{stage}Seconds"] for stage in ("Decode", "Collate", "Forward", "Encode"))
    assert 0 < stages <= values["HandlerLatencySeconds"]
    assert values["HandlerErrors"] == 2  # both bad requests are 400s: one line for the code, counting 2
    for name, _, dims in lines:
        expected = {"model": "digits", "lane": "digits"} | ({"code": "400"} if name == "HandlerErrors" else {})
        assert dims == expected, name


def test_a_worker_start_is_counted(digits_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="ts.metrics.caching_metric"):
        MODULE.UnifiedHandler().initialize(make_context(digits_model_dir, 0))
    assert [(name, value) for name, value, _ in emitted(caplog)] == [("HandlerWorkerStarts", 1)]


def test_a_metrics_config_without_the_handlers_metrics_still_gets_them(digits_model_dir, caplog):
    # TorchServe's default metrics.yaml declares none of them: the handler adds its own to the worker's cache.
    context = make_context(digits_model_dir, 1, Path(ts.__file__).parent / "configs" / "metrics.yaml")
    handler = MODULE.UnifiedHandler()
    handler.initialize(context)
    with caplog.at_level(logging.INFO, logger="ts.metrics.caching_metric"):
        handler.handle([{"body": bytearray(grid_png(held_out(1)[0][0]))}], context)
    assert {name for name, _, _ in emitted(caplog)} >= {"HandlerBatchRequests", "HandlerForwardSeconds"}


def test_debug_logging_writes_one_line_per_batch_and_info_nothing_per_request(digits_model_dir, caplog):
    grids, _ = held_out(3)
    data = [{"body": bytearray(grid_png(grid))} for grid in grids]
    quiet = MODULE.UnifiedHandler()
    quiet.initialize(make_context(digits_model_dir, 0))
    caplog.clear()  # the worker's start line, at info
    with caplog.at_level(logging.INFO):  # what TorchServe's worker logs by default
        quiet.handle(data, make_context(digits_model_dir, len(data)))
    assert not [r for r in caplog.records if r.name.startswith("handlers")]

    verbose = MODULE.UnifiedHandler()
    verbose.initialize(make_context(digits_model_dir, 0, logging={"level": "debug"}))
    caplog.clear()
    try:
        with caplog.at_level(logging.INFO):
            caplog.handler.setLevel(logging.NOTSET)  # as the worker's stdout handler: the loggers' levels decide
            verbose.handle(data, make_context(digits_model_dir, len(data)))
    finally:
        logging.getLogger("handlers").setLevel(logging.NOTSET)
    [line] = [r.getMessage() for r in caplog.records if r.name.startswith("handlers")]
    assert line.startswith("batch lane=digits requests=3 rows=3 errors=0 forwards=[3] oom_splits=0 decode_ms=")
    assert "collate_ms=" in line and "forward_ms=" in line and "encode_ms=" in line and "total_ms=" in line


def test_an_unknown_log_level_stops_the_worker(digits_model_dir):
    with pytest.raises(SettingsError, match="logging.level must be"):
        MODULE.UnifiedHandler().initialize(make_context(digits_model_dir, 0, logging={"level": "loud"}))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_lanes_report_device_memory(caplog):
    cache = MetricsCacheYamlImpl(config_file_path=str(METRICS_YAML))
    cache.initialize_cache()
    lane = metrics.HandlerMetrics(cache, "digits", "digits", torch.device("cuda:0"))
    with caplog.at_level(logging.INFO, logger="ts.metrics.caching_metric"):
        lane.started()
        lane.batch([Response(200, {}, 1)], StageTimes(forward_rows=[1]), 0.01)
    values = {name: value for name, value, _ in emitted(caplog)}
    assert values["HandlerGPUMemoryTotalMB"] > 1000
    assert 0 <= values["HandlerGPUMemoryAllocatedMB"] <= values["HandlerGPUMemoryReservedMB"] < values["HandlerGPUMemoryTotalMB"]


def test_a_batchs_metric_lines_leave_the_worker_in_one_write_and_torchserves_own_lines_are_dropped(monkeypatch):
    # TorchServe's worker logs to its stdout through a root StreamHandler; the frontend's reader thread wakes per write.
    writes: list[str] = []

    class Stdout:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    stdout = Stdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    handler = logging.StreamHandler(stdout)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        metrics.configure_logging({})
        cache = MetricsCacheYamlImpl(config_file_path=str(METRICS_YAML))
        cache.initialize_cache()
        lane = metrics.HandlerMetrics(cache, "digits", "digits", torch.device("cpu"))
        lane.batch([Response(200, {}, 1), Response(400, {}, 1)], StageTimes(forward_rows=[1]), 0.01)
        cache.add_time("PredictionTime", 1.5)  # what TorchServe's service emits after each batch: not exported
    finally:
        root.removeHandler(handler)
        logging.getLogger(metrics.METRIC_LOGGER).removeFilter(metrics._GATE)
    [write] = writes
    names = [line.split(".")[0].removeprefix("[METRICS]") for line in write.splitlines()]
    assert len(names) == 9 and names[0] == "HandlerBatchRequests" and names[-1] == "HandlerErrors"
    assert "PredictionTime" not in write


def test_torchserves_chatter_in_the_worker_is_off_by_default_and_one_switch_away():
    try:
        assert metrics.configure_logging({}) == "INFO"
        assert logging.getLogger().level == logging.WARNING  # "Backend received inference at" per batch: off
        assert logging.getLogger(metrics.METRIC_LOGGER).getEffectiveLevel() == logging.INFO
        metrics.configure_logging({"logging": {"torchserve": "info"}})
        assert logging.getLogger().level == logging.INFO
        with pytest.raises(SettingsError, match="logging.torchserve must be"):
            metrics.configure_logging({"logging": {"torchserve": "chatty"}})
    finally:
        logging.getLogger().setLevel(logging.WARNING)
        logging.getLogger("handlers").setLevel(logging.NOTSET)


def test_the_lines_are_torchserves_own_format(caplog):
    """The handler writes its metric lines itself (one record per batch, not one per line): the same text that
    TorchServe's CachingMetric.add_or_update logs for the same value and dimensions, clock aside."""
    cache = MetricsCacheYamlImpl(config_file_path=str(METRICS_YAML))
    cache.initialize_cache()
    metrics.configure_logging({})
    lane = metrics.HandlerMetrics(cache, "digits", "digits-bulk", torch.device("cpu"))
    try:
        with caplog.at_level(logging.INFO, logger="ts.metrics.caching_metric"):
            lane.batch([Response(200, {}, 3), Response(413, {}, 0)], StageTimes(decode=0.25, forward_rows=[3]), 0.5)
            [ours] = caplog.messages
            caplog.clear()
            metrics._GATE.open = True
            cache.get_metric("HandlerLatencySeconds", MetricTypes.HISTOGRAM).add_or_update(0.5, ["digits", "digits-bulk"])
            cache.get_metric("HandlerErrors", MetricTypes.COUNTER).add_or_update(1, ["digits", "digits-bulk", "413"])
            theirs = caplog.messages
    finally:
        metrics._GATE.open = False
    lines = ours.splitlines()
    assert len(lines) == 9
    for line in theirs:  # up to the clock (whole seconds, which may tick between the two)
        assert any(mine.rsplit(",", 1)[0] == line.rsplit(",", 1)[0] for mine in lines), (line, lines)
    assert all(line.rsplit(",", 1)[1].isdigit() for line in lines)
