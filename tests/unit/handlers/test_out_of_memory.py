"""Out of memory, for real, from every loader: each format's runtime raises its own error when an allocation fails
(torch's CPU allocator and TorchScript a RuntimeError, onnxruntime its Fail, CUDA torch.OutOfMemoryError), and the
core must split the micro-batch for each alike. The memory limit is real: the worker runs in a subprocess whose
address space is capped just above what it holds (tests/unit/handlers/capped_worker.py). CUDA's own out-of-memory
is provoked on a GPU by tests/unit/handlers/test_cuda_path.py and scripts/gpu/check.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import orjson
import pytest
import torch

from handlers.core import InferenceCore
from handlers.decoding import Payload
from handlers.errors import is_out_of_memory
from models.digits.archive import artifacts
from models.digits.samples import held_out
from scripts.layout import BUILD, ROOT
from tests.unit.conftest import digits_settings
from tests.unit.handlers.test_metrics import emitted_lines

ROWS = 16_384
# 16,384 rows of the digits CNN need about 1 GiB at once through torch, TorchScript or onnxruntime: 400 MiB above
# what the warmed worker holds lets 8,192 or fewer through (one or two splits). AOTInductor's fused kernels need
# about a fifth of that, so its cap is tighter.
HEADROOM_MB = {"aoti": 100}
DEFAULT_HEADROOM_MB = 400
# make test splits a real out-of-memory on the export loader; the other loaders' (10-20 s each) in `make test-slow`.
FORMATS = ["export", *(pytest.param(fmt, marks=pytest.mark.slow) for fmt in ("torchscript", "onnx", "aoti"))]


def capped_batch(model_file, headroom_mb: int) -> dict:
    completed = subprocess.run(
        [sys.executable, "-m", "tests.unit.handlers.capped_worker", "--model-dir", str(model_file.parent)]
        + ["--model-file", model_file.name, "--rows", str(ROWS), "--headroom-mb", str(headroom_mb)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return orjson.loads(completed.stdout)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_real_out_of_memory_is_split_for_every_loader(fmt):
    [model_file] = artifacts("1.0", BUILD, fmt)
    result = capped_batch(model_file, HEADROOM_MB.get(fmt, DEFAULT_HEADROOM_MB))
    assert result["statuses"] == [200, 200]  # both requests of the batch answered, none failed
    assert result["warnings"] and all("out of memory" in line and "retrying" in line for line in result["warnings"])
    metrics = emitted_lines(result["metrics"])
    [splits] = [value for name, value, _ in metrics if name == "HandlerOOMSplits"]
    assert splits == len(result["warnings"]) >= 1  # the split counter moved, once per halving
    forward_rows = [value for name, value, _ in metrics if name == "HandlerForwardRows"]
    assert sum(forward_rows) == ROWS + 1 and max(forward_rows) <= ROWS // 2  # every row ran, in smaller passes
    # The answers are those of the same model, uncapped, in one pass.
    core = InferenceCore.load(
        model_file.parent, digits_settings(model_file=model_file.name, max_batch_rows=ROWS), torch.device("cpu")
    )
    grids = np.resize(held_out()[0], (ROWS, 8, 8))
    [response] = core.answer([Payload(items=grids.tolist(), raw=False)])
    expected = np.array([row["scores"] for row in response.body["predictions"]])
    served = np.array(result["scores"][0])
    assert (served.argmax(1) == expected.argmax(1)).all()
    np.testing.assert_allclose(served, expected, atol=1e-5)
    np.testing.assert_allclose(result["scores"][1][0], expected[0], atol=1e-5)


# What each runtime says when an allocation fails, as it says it (read from the runs above and on the GPU).
OUT_OF_MEMORY_MESSAGES = [
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "268435456 bytes. Error code 12 (Cannot allocate memory)",
    "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Conv node. Name:'relu_nchwc' Status "
    "Message: bfc_arena.cc:360 onnxruntime::BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer",
    "CUDA failure 2: out of memory ; GPU=0 ; hostname=h ; file=cuda_allocator.cc ; line=47 ; expr=cudaMalloc(&p, size);",
    "CUDA error: out of memory",
]


@pytest.mark.parametrize("message", OUT_OF_MEMORY_MESSAGES)
def test_each_runtimes_out_of_memory_is_recognised(message):
    assert is_out_of_memory(RuntimeError(message))


def test_torchs_own_out_of_memory_type_is_recognised_and_other_errors_are_not():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x10 and 64x128)"))
    assert not is_out_of_memory(ValueError("expected 64 values"))


def test_an_error_that_is_not_out_of_memory_is_not_split(digits_core, monkeypatch):
    calls = []

    def broken(model, batch):
        calls.append(len(batch))
        raise RuntimeError("a real bug in the model program")

    monkeypatch.setattr(digits_core.task, "forward", broken)
    rows = digits_core.decode(Payload(items=held_out()[0][:64].tolist(), raw=False))
    with pytest.raises(RuntimeError, match="a real bug"):
        digits_core.predict(rows)
    assert calls == [64]  # raised at once: no halving, no retry
