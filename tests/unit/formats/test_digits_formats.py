"""digits in every format: the eager CNN's labels on the held-out split, scores within a stated tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handlers.core import select_device
from tests.unit.formats.conftest import digits_file, digits_scores, format_digits_core

# AOTInductor compiles take a minute or more each on 2 cores: `make test-slow` (run by .ci/run) covers them.
FORMATS = ["export", "torchscript", pytest.param("aoti", marks=pytest.mark.slow), "onnx"]
FP32_SCORE_TOLERANCE = 1e-5  # absolute, on probabilities
BF16_SCORE_TOLERANCE = 2e-2  # measured worst 3.2e-3 (autocast) / 2.6e-3 (AOTInductor) on this split


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp32_labels_equal_eager_and_scores_within_1e5(fmt, held_out_digits, eager_digit_scores):
    scores = digits_scores(format_digits_core(digits_file(fmt)), held_out_digits[0])
    assert scores.shape == eager_digit_scores.shape == (360, 10)
    np.testing.assert_array_equal(scores.argmax(1), eager_digit_scores.argmax(1))
    assert np.abs(scores - eager_digit_scores).max() <= FP32_SCORE_TOLERANCE


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_row_and_uneven_batches_follow_the_dynamic_batch_axis(fmt, held_out_digits, eager_digit_scores):
    core = format_digits_core(digits_file(fmt), max_batch_rows=7)  # passes of 7 rows, then the 3 left over
    np.testing.assert_allclose(digits_scores(core, held_out_digits[0][:1]), eager_digit_scores[:1], atol=FP32_SCORE_TOLERANCE)
    np.testing.assert_allclose(digits_scores(core, held_out_digits[0][:10]), eager_digit_scores[:10], atol=FP32_SCORE_TOLERANCE)


@pytest.mark.parametrize(
    ("fmt", "precision"), [("export", "bf16"), ("torchscript", "bf16"), pytest.param("aoti", "bf16", marks=pytest.mark.slow)]
)
def test_bf16_on_the_cpu_keeps_the_labels(fmt, precision, held_out_digits, eager_digit_scores):
    """bf16 by autocast (export, torchscript: the fp32 file) or compiled in (digits.bf16.aoti.pt2)."""
    core = format_digits_core(digits_file(fmt, precision), precision=precision)
    scores = digits_scores(core, held_out_digits[0])
    assert not np.array_equal(scores, eager_digit_scores), "bf16 gave fp32's exact scores: autocast did not apply"
    np.testing.assert_array_equal(scores.argmax(1), eager_digit_scores.argmax(1))
    assert np.abs(scores - eager_digit_scores).max() <= BF16_SCORE_TOLERANCE


@pytest.mark.parametrize(
    ("fmt", "precision", "said"), [("export", "fp16", "fp16 is for CUDA"), ("onnx", "bf16", "must be built in")]
)
def test_a_precision_that_cannot_apply_runs_the_file_as_it_is_and_says_so(
    fmt, precision, said, held_out_digits, eager_digit_scores, caplog
):
    scores = digits_scores(format_digits_core(digits_file(fmt), precision=precision), held_out_digits[0][:20])
    np.testing.assert_allclose(scores, eager_digit_scores[:20], atol=FP32_SCORE_TOLERANCE)
    assert said in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("fmt", "precision"), [("export", "fp16"), ("torchscript", "fp16"), ("export", "bf16"), ("onnx", "fp32")]
)
def test_cuda_formats_keep_the_labels(fmt, precision, held_out_digits, eager_digit_scores):
    if fmt == "onnx":
        onnxruntime = pytest.importorskip("onnxruntime")
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            pytest.skip("onnxruntime without CUDAExecutionProvider (needs the onnxruntime-gpu package)")
    core = format_digits_core(digits_file(fmt), select_device(0), precision=precision)
    scores = digits_scores(core, held_out_digits[0])
    np.testing.assert_array_equal(scores.argmax(1), eager_digit_scores.argmax(1))
    assert np.abs(scores - eager_digit_scores).max() <= (
        FP32_SCORE_TOLERANCE * 10 if precision == "fp32" else BF16_SCORE_TOLERANCE
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cpu_compiled_aoti_package_refuses_cuda_by_name():
    with pytest.raises(ValueError, match="compiled by AOTInductor for cpu"):
        format_digits_core(digits_file("aoti"), select_device(0))
