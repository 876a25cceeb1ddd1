"""CUDA graphs' bucket logic and padding, and the GPU settings' checks, on the CPU; capture and replay on a GPU are
in test_cuda_graphs_gpu.py (marked gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handlers import cuda_graphs
from handlers.core import InferenceCore
from handlers.cuda_graphs import Bucket, batch_buckets, choose, pad_batch, sequence_buckets
from handlers.decoding import Payload
from handlers.device_settings import DeviceSettings
from handlers.errors import SettingsError
from handlers.settings import HandlerSettings
from models.digits.samples import held_out
from models.minilm.samples import cosines, varied_sentences
from tests.unit.formats.conftest import digits_file, format_digits_core, format_minilm_core, minilm_file


def test_batch_buckets_double_up_to_the_lanes_batch_size():
    assert batch_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert batch_buckets(24) == (1, 2, 4, 8, 16, 24)  # a batchSize that is no power of two is its own last bucket
    assert batch_buckets(1) == (1,)
    assert batch_buckets(2) == (1, 2)


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, None])
def test_batch_buckets_refuse_a_bad_largest_size(bad):
    with pytest.raises(ValueError, match="positive integer"):
        batch_buckets(bad)


def test_sequence_buckets_double_from_16_up_to_the_longest_text():
    assert sequence_buckets(256) == (16, 32, 64, 128, 256)
    assert sequence_buckets(200) == (16, 32, 64, 128, 200)
    assert sequence_buckets(12) == (12,)


def test_a_batch_is_padded_up_to_the_smallest_bucket_that_holds_it():
    rows = batch_buckets(16)
    assert choose(1, None, rows, None) == Bucket(1)
    assert choose(3, None, rows, None) == Bucket(4)
    assert choose(16, None, rows, None) == Bucket(16)
    assert choose(5, 17, rows, (16, 32, 64)) == Bucket(8, 32)
    assert choose(2, 16, rows, (16, 32, 64)) == Bucket(2, 16)


def test_batches_above_the_largest_bucket_run_eagerly():
    assert choose(17, None, batch_buckets(16), None) is None  # more rows than the lane's batchSize
    assert choose(4, 65, batch_buckets(16), (16, 32, 64)) is None  # longer than the longest sequence bucket
    assert choose(4, 12, batch_buckets(16), None) == Bucket(4)  # fixed-size inputs: rows alone


def test_all_buckets_cross_rows_and_lengths():
    assert cuda_graphs.all_buckets((1, 2), None) == [Bucket(1), Bucket(2)]
    assert cuda_graphs.all_buckets((1, 2), (16, 32)) == [Bucket(1, 16), Bucket(1, 32), Bucket(2, 16), Bucket(2, 32)]


def test_padded_digit_rows_leave_the_real_rows_answers_unchanged():
    core = format_digits_core(digits_file("export"))
    grids, _ = held_out(3)
    batch = core.task.collate(core.decode(Payload(items=[g.tolist() for g in grids], raw=False)), None)
    padded = pad_batch(batch, Bucket(8))
    assert padded.shape == (8, 1, 8, 8)
    assert torch.equal(padded[:3], batch) and not padded[3:].any()
    with torch.inference_mode():
        plain, through_padding = core.model(batch), core.model(padded)[:3]
    np.testing.assert_allclose(through_padding.numpy(), plain.numpy(), atol=1e-6)


def test_padded_texts_leave_the_real_rows_embeddings_unchanged():
    core = format_minilm_core(minilm_file("export"))
    texts = varied_sentences(60)[:5]
    batch = core.task.collate(core.decode(Payload(items=texts, raw=False)), None)
    rows, length = cuda_graphs.batch_shape(batch)
    bucket = choose(rows, length, batch_buckets(8), sequence_buckets(core.task.max_seq_length))
    assert bucket.rows == 8 and bucket.length >= length
    padded = pad_batch(batch, bucket)
    assert padded["input_ids"].shape == padded["attention_mask"].shape == (8, bucket.length)
    assert padded["attention_mask"][rows:].sum(dim=1).tolist() == [1] * (8 - rows)  # no padding row fully masked
    assert not padded["attention_mask"][:rows, length:].any()
    with torch.inference_mode():
        plain = core.task.forward(core.model, batch).numpy()
        through_padding = core.task.forward(core.model, padded)[:rows].numpy()
    assert cosines(through_padding, plain).min() >= 0.99999
    np.testing.assert_allclose(through_padding, plain, atol=1e-5)


def test_a_cpu_worker_asked_for_graphs_runs_eagerly(caplog):
    core = format_digits_core(digits_file("export"))
    grids, labels = held_out(4)
    assert core.capture_graphs(32) is None
    assert core.graphs is None
    assert "cuda_graphs is on but this worker runs on cpu" in caplog.text
    [response] = core.answer([Payload(items=[g.tolist() for g in grids], raw=False)])
    assert [p["label"] for p in response.body["predictions"]] == labels.tolist()


def test_the_graph_runner_refuses_a_cpu_device():
    with pytest.raises(ValueError, match="need a CUDA device"):
        cuda_graphs.GraphRunner(lambda b: b, torch.device("cpu"), [Bucket(1)], torch.zeros(1, 1, 8, 8))


# -- the settings, checked at start ----------------------------------------------------------------


def settings(**handler) -> HandlerSettings:
    return HandlerSettings.from_yaml({"handler": {"task": "digit_classification", "model_file": "digits.pt2", **handler}})


def test_the_gpu_settings_are_off_by_default():
    device = settings().device
    assert device == DeviceSettings()
    assert not device.graphs_for("digits") and not device.cast_weights and device.sdpa_backends is None


def test_cuda_graphs_per_lane():
    device = settings(cuda_graphs={"digits": True, "default": False}).device
    assert device.graphs_for("digits") and not device.graphs_for("digits-bulk")
    assert settings(cuda_graphs=True).device.graphs_for("digits-bulk")
    assert "cuda_graphs" not in settings(cuda_graphs=True).task_options  # not a task key


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ({"cuda_graphs": "yes"}, "handler.cuda_graphs must be true, false or"),
        ({"cuda_graphs": {"digits": 1}}, "handler.cuda_graphs must be true, false or"),
        ({"graph_sequence_buckets": [32, 16]}, "ascending order, got \\[32, 16\\]"),
        ({"graph_sequence_buckets": [0, 16]}, "positive integers"),
        ({"graph_sequence_buckets": 64}, "must be a list"),
        ({"graph_sequence_buckets": [16, 16]}, "ascending order"),
        ({"sdpa_backends": ["fast"]}, "sdpa_backends must be a non-empty list of flash, efficient, math, cudnn"),
        ({"sdpa_backends": "math"}, "sdpa_backends must be a non-empty list"),
        ({"sdpa_backends": []}, "sdpa_backends must be a non-empty list"),
        ({"cast_weights": "true"}, "handler.cast_weights must be true or false"),
        ({"cast_weights": True}, "cast_weights needs precision bf16 or fp16, got 'fp32'"),
        ({"cast_weights": True, "precision": "bf16"}, "digits.pt2 is not a bf16 file"),
    ],
)
def test_bad_gpu_settings_stop_the_start_with_what_is_allowed(handler, message):
    with pytest.raises(SettingsError, match=message):
        settings(**handler)


def test_sequence_buckets_longer_than_the_longest_text_are_refused():
    handler = {"task": "text_embedding", "model_file": "minilm.pt2", "max_seq_length": 128}
    with pytest.raises(SettingsError, match="up to max_seq_length \\(128\\) at most, got \\[64, 256\\]"):
        HandlerSettings.from_yaml({"handler": {**handler, "graph_sequence_buckets": [64, 256]}})


def test_weights_cast_once_run_without_autocast_on_inputs_of_their_precision():
    device = settings(cast_weights=True, precision="bf16", model_file="digits.bf16.pt2").device
    assert device.cast_weights and device.sdpa_backends is None
    assert settings(sdpa_backends=["flash", "efficient", "math"]).device.sdpa_backends == ("flash", "efficient", "math")


def test_digits_exported_with_weights_cast_to_bf16_answer_within_the_bf16_bounds(tmp_path):
    from models.digits.formats import eager_from_program
    from models.portable import of
    from scripts.gpu.models import write_format

    eager = eager_from_program(digits_file("export"))
    path, _ = write_format(of("digits"), eager, "export", tmp_path, torch.device("cpu"), precision="bf16")
    assert path.name == "digits.bf16.pt2"
    handler = {"task": "digit_classification", "model_file": path.name, "precision": "bf16", "cast_weights": True}
    cast = InferenceCore.load(tmp_path, HandlerSettings.from_yaml({"handler": handler}), torch.device("cpu"))
    assert cast.autocast_dtype is None and cast.input_dtype is torch.bfloat16
    grids, labels = held_out(60)
    items = [g.tolist() for g in grids]
    [fp32] = format_digits_core(digits_file("export")).answer([Payload(items=items, raw=False)])
    [bf16] = cast.answer([Payload(items=items, raw=False)])
    assert [p["label"] for p in bf16.body["predictions"]] == [p["label"] for p in fp32.body["predictions"]]
    scores = np.array([p["scores"] for p in bf16.body["predictions"]])
    np.testing.assert_allclose(scores, [p["scores"] for p in fp32.body["predictions"]], atol=2e-2)
    assert not np.array_equal(scores, [p["scores"] for p in fp32.body["predictions"]])  # really ran in bf16
