"""The CUDA path of the core, for the device machine (`make gpu-check`); deselected elsewhere."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from handlers.core import InferenceCore, select_device
from handlers.decoding import Payload
from models.digits.samples import held_out
from tests.unit.conftest import digits_settings

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


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
    np.testing.assert_allclose(
        [p["scores"] for p in gpu.body["predictions"]], [p["scores"] for p in cpu.body["predictions"]], atol=1e-4
    )


def test_bf16_autocast_keeps_labels(digits_model_dir, digits_core):
    core = InferenceCore.load(digits_model_dir, digits_settings(precision="bf16"), select_device(0))
    grids, labels = held_out()
    [response] = core.answer([rows_payload(grids)])
    assert np.mean(np.array([p["label"] for p in response.body["predictions"]]) == labels) >= 0.97


def test_a_real_out_of_memory_is_survived(digits_model_dir):
    """Cap this process's share of the GPU so a large micro-batch really runs out of memory."""
    core = InferenceCore.load(digits_model_dir, digits_settings(max_batch_rows=1 << 20), select_device(0))
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(2 * 2**30 / total, 0)  # 2 GiB
    try:
        grids = np.resize(held_out()[0], (300_000, 8, 8))
        [response] = core.answer([rows_payload(grids)])
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
    assert response.status == 200 and len(response.body["predictions"]) == 300_000


def test_print_throughput_figures(cuda_core, digits_core):
    """Prints rows/s on CUDA and CPU side by side (no assertion on speed); checks every row is answered."""
    for rows in (1, 16, 512, 20_000):
        grids = np.resize(held_out()[0], (rows, 8, 8))
        payload = rows_payload(grids)
        figures = []
        for name, core in (("cuda", cuda_core), ("cpu", digits_core)):
            [warm_up] = core.answer([payload])
            assert warm_up.status == 200 and len(warm_up.body["predictions"]) == rows
            started = time.perf_counter()
            repeats = max(1, 2000 // rows)
            for _ in range(repeats):
                core.answer([payload])
            figures.append((name, rows * repeats / (time.perf_counter() - started)))
        print(f"rows={rows}: " + ", ".join(f"{name} {rate:,.0f} rows/s" for name, rate in figures))
