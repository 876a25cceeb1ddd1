"""The CUDA path of the core, for a machine with a GPU (`make gpu-check`); deselected elsewhere. The same ground, with
figures, is covered by scripts/gpu/check.py, which also runs where only torch is installed (docs/gpu.md)."""

from __future__ import annotations

import logging

import numpy as np
import orjson
import pytest
import torch

from handlers.core import InferenceCore, select_device
from handlers.decoding import Payload
from models.digits.archive import artifacts
from models.digits.formats import eager_from_program
from models.digits.samples import held_out
from models.portable import of
from scripts.gpu import models as gpu_models
from scripts.gpu.check import memory_cap
from scripts.layout import BUILD
from tests.unit.conftest import digits_settings
from tests.unit.handlers.test_metrics import emitted_lines
from tests.unit.handlers.test_torchserve_handler import MODULE, make_context

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

EXPORT_MAX_ROWS = 1 << 16  # the digits export's batch maximum: an out-of-memory must happen inside it


def rows_payload(grids) -> Payload:
    return Payload(items=[g.tolist() for g in grids], raw=False)


@pytest.fixture(scope="module")
def cuda_core(digits_model_dir):
    return InferenceCore.load(digits_model_dir, digits_settings(), select_device(0))


def test_cuda_is_selected_from_the_gpu_id():
    assert select_device(0) == torch.device("cuda:0")


@pytest.mark.parametrize("rows", [1, 7, 360, 5000])
def test_cuda_answers_match_cpu(cuda_core, digits_core, rows):
    grids = np.resize(held_out()[0], (rows, 8, 8))
    [gpu] = cuda_core.answer([rows_payload(grids)])
    [cpu] = digits_core.answer([rows_payload(grids)])
    assert [p["label"] for p in gpu.body["predictions"]] == [p["label"] for p in cpu.body["predictions"]]
    # fp32 is strict fp32 on CUDA (no TF32): within 1e-5 of the CPU (4e-7 on an H200).
    np.testing.assert_allclose(
        [p["scores"] for p in gpu.body["predictions"]], [p["scores"] for p in cpu.body["predictions"]], atol=1e-5
    )


def test_bf16_autocast_keeps_labels(digits_model_dir, digits_core):
    core = InferenceCore.load(digits_model_dir, digits_settings(precision="bf16"), select_device(0))
    grids, labels = held_out()
    [response] = core.answer([rows_payload(grids)])
    assert np.mean(np.array([p["label"] for p in response.body["predictions"]]) == labels) >= 0.97


def model_file_for(fmt: str):
    if fmt == "aoti":  # compiled for this GPU, from the CPU program
        eager = eager_from_program(artifacts("1.0", BUILD)[0])
        portable = of("digits")
        path, _ = gpu_models.write_format(portable, eager, "aoti", BUILD / "gpu-check" / "digits-cuda", select_device(0))
        return path
    return artifacts("1.0", BUILD, fmt)[0]


@pytest.mark.parametrize("fmt", ["export", "torchscript", "aoti", "onnx"])
def test_a_real_out_of_memory_is_split_for_every_loader(fmt, digits_core, caplog):
    """A memory cap sized from a measured pass: 16,384 rows fit, the 65,536-row micro-batch (the export's maximum)
    cannot, so the allocator really fails and the core must split; the split counter moves, the answers are the CPU's."""
    if fmt == "onnx":
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            pytest.skip("this onnxruntime has no CUDAExecutionProvider")
    path = model_file_for(fmt)
    device = select_device(0)
    handler_section = {"task": "digit_classification", "model_file": path.name, "max_batch_rows": EXPORT_MAX_ROWS}
    handler_section["max_request_rows"] = EXPORT_MAX_ROWS
    handler = MODULE.UnifiedHandler()
    handler.initialize(make_context(path.parent, 0, handler=handler_section))
    assert handler.core.device == device
    grids = np.resize(held_out()[0], (EXPORT_MAX_ROWS, 8, 8))
    handler.core.answer([rows_payload(grids[:8192])])
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    handler.core.answer([rows_payload(grids[:8192])])
    peak = torch.cuda.max_memory_allocated(device) - baseline
    data = [{"body": {"instances": grids.tolist()}}, {"body": {"instances": [grids[0].tolist()]}}]
    context = make_context(path.parent, 2, handler=handler_section)
    with memory_cap(baseline + 2 * peak + (64 << 20), device), caplog.at_level(logging.INFO, logger="ts.metrics.caching_metric"):
        answers = handler.handle(data, context)
    assert [context.get_response_status(i)[0] for i in range(2)] == [200, 200]
    lines = emitted_lines([m for m in caplog.messages if m.startswith("[METRICS]")])
    [splits] = [value for name, value, _ in lines if name == "HandlerOOMSplits"]
    assert splits >= 1
    assert max(value for name, value, _ in lines if name == "HandlerForwardRows") < EXPORT_MAX_ROWS
    served = np.array([row["scores"] for row in orjson.loads(answers[0])["predictions"]])
    [cpu] = digits_core.answer([rows_payload(grids)])
    expected = np.array([row["scores"] for row in cpu.body["predictions"]])
    assert (served.argmax(1) == expected.argmax(1)).all()
    np.testing.assert_allclose(served, expected, atol=1e-5)


def test_a_text_too_large_alone_fails_only_its_request():
    """minilm under a cap found by search where one 256-token text cannot run even alone: its request gets a 507,
    the request of short texts batched with it is answered as without a cap."""
    from scripts.gpu.check import Budget, Check, Report

    check = Check(
        BUILD / "gpu-bundle",
        BUILD / "gpu-check" / "models",
        select_device(0),
        Budget(600),
        Report(BUILD / "gpu-check"),
        ["minilm"],
    )
    check.formats = ("export",)
    check.agreement(("minilm",))
    figures = check.row_too_large_alone("minilm", of("minilm").long_item())
    assert figures["statuses"] == [507, 200] and figures["oom_splits"] >= 1
    assert figures["short_to_uncapped"]["within"]
