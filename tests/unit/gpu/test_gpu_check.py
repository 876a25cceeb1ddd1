"""What the GPU run found, kept true on the CPU: gpu-check stops without CUDA, traces keep fp32 strict and say which
device they were traced on, padded text lengths leave embeddings unchanged. The CUDA side: tests/unit/handlers/
test_cuda_path.py and scripts/gpu/check.py (docs/gpu.md)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from handlers.decoding import Payload
from handlers.model_files import _CPU_DEVICE_CONSTANT
from models.minilm.samples import cosines, varied_sentences
from scripts.layout import ROOT
from tests.unit.formats.conftest import digits_file, format_minilm_core, minilm_embeddings, minilm_file

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@no_cuda
def test_the_gpu_check_stops_at_once_without_cuda():
    completed = subprocess.run([sys.executable, "-m", "scripts.gpu.check"], cwd=ROOT, capture_output=True, text=True)
    assert completed.returncode == 2
    assert "gpu-check needs CUDA, and this machine has none" in completed.stderr


@no_cuda
def test_make_gpu_check_fails_with_the_reason_without_cuda():
    completed = subprocess.run(["make", "--no-print-directory", "gpu-check"], cwd=ROOT, capture_output=True, text=True)
    assert completed.returncode != 0
    assert "make gpu-check needs CUDA: torch.cuda.is_available() is False" in completed.stderr


def convolution_tf32_flags(path) -> list[bool]:
    """aten::_convolution's last argument (allow_tf32) in each convolution of a traced file, as traced."""
    graph = torch.jit.load(str(path), map_location="cpu").inlined_graph
    flags = []
    for node in graph.nodes():
        if node.kind() == "aten::_convolution":
            constant = list(node.inputs())[-1].node()
            assert constant.kind() == "prim::Constant"
            flags.append(bool(constant.i("value")))
    return flags


def test_torchscript_traces_keep_fp32_strict():
    # The CUDA default (TF32 on) written into a trace moved digits by 3e-4 from the CPU's on an H200.
    assert convolution_tf32_flags(digits_file("torchscript")) == [False, False]


def test_a_cpu_traced_graph_that_creates_tensors_on_the_cpu_is_recognised():
    minilm = str(torch.jit.load(str(minilm_file("torchscript")), map_location="cpu").inlined_graph)
    digits = str(torch.jit.load(str(digits_file("torchscript")), map_location="cpu").inlined_graph)
    assert _CPU_DEVICE_CONSTANT.search(minilm)  # transformers' attention mask: refused on CUDA at load
    assert not _CPU_DEVICE_CONSTANT.search(digits)  # runs anywhere (it did, on the H200)


def test_lengths_padded_to_a_multiple_leave_embeddings_unchanged():
    sentences = varied_sentences(96)
    core = format_minilm_core(minilm_file("export"))
    plain = minilm_embeddings(core, sentences)
    core.task.pad_to_multiple = 32
    batch = core.task.collate(core.decode(Payload(items=sentences[:5], raw=False)), None)
    assert batch["input_ids"].shape[1] % 32 == 0
    padded = minilm_embeddings(core, sentences)
    assert cosines(padded, plain).min() >= 0.99999
    np.testing.assert_allclose(padded, plain, atol=1e-5)
