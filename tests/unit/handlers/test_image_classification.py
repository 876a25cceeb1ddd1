"""The image classification task in-process (InferenceCore, no server): efficientnet_lite0's exported program on real
photographs against the eager reference (same weights, torchvision's own transforms, models/.../samples.py),
raw bodies and {"b64": ...} instances, and bad images failing alone in their batch."""

from __future__ import annotations

import base64
import functools
import io
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from handlers.core import InferenceCore
from handlers.decoding import Payload, read_body
from handlers.errors import RequestError, SettingsError
from handlers.settings import HandlerSettings
from models.efficientnet_lite0.archive import artifacts
from models.efficientnet_lite0.samples import PHOTOGRAPHS, photograph_bytes, reference_probabilities, reference_top_k
from scripts.layout import BUILD, ROOT
from tests.malformed import png_header
from tests.unit.handlers.test_images import encoded, gif_of_frames, png_bomb

MODEL_CONFIG = ROOT / "models" / "efficientnet_lite0" / "model-config.yaml"
TOLERANCE = 1e-4


def classifier_settings(lane: str | None = None, **changes) -> HandlerSettings:
    config = yaml.safe_load(MODEL_CONFIG.read_text())
    config["handler"] = {**config["handler"], **changes}
    return HandlerSettings.from_yaml(config, lane)


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread, as the stream lane's workers run (torch_threads: 1): on a shared 2-core machine OpenMP's
    spinning threads made a pass 10-30x slower. tests/conftest.py restores the count after each test."""
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """build/efficientnet_lite0/1.0 with the program and the class names (exported on first use, as make archive does)."""
    return artifacts("1.0", BUILD)[0].parent


@pytest.fixture(scope="module")
def core(model_dir) -> InferenceCore:
    return InferenceCore.load(model_dir, classifier_settings(), torch.device("cpu"))


@functools.cache
def photographs() -> tuple[bytes, ...]:
    return tuple(photograph_bytes(name) for name in PHOTOGRAPHS)


@functools.cache
def references() -> tuple[list, np.ndarray]:
    return reference_top_k(list(photographs())), reference_probabilities(list(photographs()))


def b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode("ascii")}


def assert_matches_reference(answers: list[dict], indexes: list[int]) -> None:
    """Each answer has the reference's top-5 (same classes, same order) and probabilities within 1e-4."""
    top, probabilities = references()
    for answer, index in zip(answers, indexes, strict=True):
        got = answer["top_k"]
        assert [(g["index"], g["label"]) for g in got] == [(r.index, r.label) for r in top[index]], PHOTOGRAPHS[index]
        for guess in got:
            assert abs(guess["probability"] - probabilities[index][guess["index"]]) <= TOLERANCE


def raw_answers(core: InferenceCore, bodies) -> list:
    return core.answer([Payload(items=[body], raw=True) for body in bodies])


def test_every_photograph_gets_the_reference_s_top_5_as_raw_bodies(core):
    responses = raw_answers(core, photographs())
    assert [r.status for r in responses] == [200] * 5
    assert_matches_reference([r.body for r in responses], list(range(5)))
    # The reference itself recognises them: a cat, an espresso, a missile, a moped.
    assert [responses[i].body["top_k"][0]["label"] for i in (0, 1, 2, 4)] == ["Egyptian cat", "espresso", "missile", "moped"]


def test_the_answer_shape(core):
    [response] = raw_answers(core, photographs()[:1])
    assert list(response.body) == ["top_k"]
    top = response.body["top_k"]
    assert len(top) == 5 and all(list(guess) == ["index", "label", "probability"] for guess in top)
    assert [g["probability"] for g in top] == sorted((g["probability"] for g in top), reverse=True)
    assert {g["index"] for g in top} <= {281, 282, 285, 287, 284}  # cats and a lynx


def test_b64_instances_in_one_request_get_the_same_answers(core):
    [response] = core.answer([Payload(items=[b64(data) for data in photographs()], raw=False)])
    assert response.status == 200
    assert_matches_reference(response.body["predictions"], list(range(5)))


@pytest.mark.parametrize("max_batch_rows", [1, 2, 5])
def test_batches_of_1_uneven_and_5_give_the_same_answers(model_dir, max_batch_rows):
    # 1: five passes of one image; 2: passes of 2, 2 and 1; 5: one pass. The batch axis is dynamic.
    core = InferenceCore.load(model_dir, classifier_settings(max_batch_rows=max_batch_rows), torch.device("cpu"))
    [response] = core.answer([Payload(items=[b64(data) for data in photographs()], raw=False)])
    assert response.status == 200
    assert_matches_reference(response.body["predictions"], list(range(5)))


def test_deterministic_mode_pads_each_pass_and_answers_the_same(model_dir):
    core = InferenceCore.load(model_dir, classifier_settings(max_batch_rows=4, deterministic=True), torch.device("cpu"))
    batch = core.task.collate([np.full((224, 224, 3), 255, np.uint8)], pad_to=4)
    assert batch.shape == (4, 3, 224, 224) and batch.dtype == torch.float32
    np.testing.assert_allclose(
        batch[0, :, 0, 0].numpy(), [(1 - 0.485) / 0.229, (1 - 0.456) / 0.224, (1 - 0.406) / 0.225], rtol=1e-6
    )
    np.testing.assert_allclose(batch[1, :, 0, 0].numpy(), [-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225], rtol=1e-6)
    responses = raw_answers(core, photographs())
    assert_matches_reference([r.body for r in responses], list(range(5)))


def test_a_raw_body_read_as_torchserve_hands_it_over(core):
    payload = read_body(bytearray(photographs()[0]), "image/png")
    assert payload.raw
    [response] = core.answer([payload])
    assert_matches_reference([response.body], [0])


def test_the_bulk_lane_reads_its_own_settings():
    stream, bulk = classifier_settings("efficientnet_lite0"), classifier_settings("efficientnet_lite0-bulk")
    assert (stream.max_batch_rows, bulk.max_batch_rows) == (4, 4)
    assert (stream.passes_for("efficientnet_lite0"), bulk.passes_for("efficientnet_lite0-bulk")) == (1, None)
    assert (stream.max_request_rows, bulk.max_request_rows) == ({"default": 8, "efficientnet_lite0-bulk": 256},) * 2


@functools.cache
def bad_inputs() -> dict[str, tuple[bytes, int, str]]:
    """name -> (image bytes, expected status, a phrase of the message); None status: answered."""
    rocket = photograph_bytes("rocket.jpg")
    return {
        "truncated JPEG": (rocket[: len(rocket) // 2], 400, "JPEG image is truncated"),
        "30000x30000 header": (png_header(30000, 30000), 413, "handler.max_image_pixels"),
        "decompression bomb": (png_bomb(8192), 413, "handler.max_image_pixels"),
        "empty body": (b"", 400, "empty image"),
        "GIF of 1000 frames": (gif_of_frames(1000), 415, "image format GIF is not accepted: send JPEG, PNG, WebP"),
        "text": (b"a sentence, not a picture", 400, "not an image"),
    }


@functools.cache
def converted_inputs() -> dict[str, bytes]:
    """A CMYK JPEG and a 16-bit grey PNG of the cat: both answered (converted to RGB as documented)."""
    cat = Image.open(io.BytesIO(photographs()[0])).convert("RGB")
    grey = np.asarray(cat.convert("L"), dtype=np.uint16)
    return {
        "CMYK JPEG": encoded(cat.convert("CMYK"), "JPEG", quality=95),
        "16-bit PNG": encoded(Image.fromarray(grey * 257), "PNG"),
        "8-bit grey PNG": encoded(Image.fromarray(grey.astype(np.uint8)), "PNG"),
    }


def test_each_bad_image_fails_alone_in_its_batch(core):
    bad = bad_inputs()
    converted = converted_inputs()
    good = photographs()
    bodies = [good[0], *(data for data, _, _ in bad.values()), good[1], *converted.values(), good[2]]
    responses = raw_answers(core, bodies)
    statuses = [response.status for response in responses]
    assert statuses == [200, *(status for _, status, _ in bad.values()), 200, 200, 200, 200, 200]
    for response, (name, (_, status, phrase)) in zip(responses[1 : 1 + len(bad)], bad.items(), strict=True):
        assert response.body["code"] == status and phrase in response.body["message"], name
    assert_matches_reference([responses[0].body, responses[7].body, responses[-1].body], [0, 1, 2])
    cmyk, sixteen, eight = (response.body for response in responses[8:11])
    # The CMYK JPEG is answered as the reference answers the same bytes (Pillow's conversion in both).
    top, probabilities = reference_top_k([converted["CMYK JPEG"]])[0], reference_probabilities([converted["CMYK JPEG"]])[0]
    assert [g["index"] for g in cmyk["top_k"]] == [r.index for r in top]
    assert max(abs(g["probability"] - probabilities[g["index"]]) for g in cmyk["top_k"]) <= TOLERANCE
    assert cmyk["top_k"][0]["index"] in (281, 282, 285)  # still a cat
    # 16-bit grey is the 8-bit grey picture scaled by 257: the same pixels once read, the same answer (to float
    # rounding: two rows of one batch may differ in the last bits, as a row's place in a batch changes its kernel's
    # blocking; 3e-7 seen).
    assert [g["index"] for g in sixteen["top_k"]] == [g["index"] for g in eight["top_k"]]
    assert max(abs(a["probability"] - b["probability"]) for a, b in zip(sixteen["top_k"], eight["top_k"], strict=True)) <= 1e-6


def test_each_bad_b64_instance_fails_its_own_request(core):
    bad = bad_inputs()
    payloads = [Payload(items=[b64(data)], raw=False) for data, _, _ in bad.values()]
    payloads.insert(2, Payload(items=[b64(photographs()[3])], raw=False))
    responses = core.answer(payloads)
    statuses = [status for _, status, _ in bad.values()]
    statuses.insert(2, 200)
    assert [r.status for r in responses] == statuses
    assert_matches_reference(responses[2].body["predictions"], [3])
    assert responses[0].body["message"].startswith("instances[0]: JPEG image is truncated")


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("aGVsbG8=", 'expected {"b64": "<base64 JPEG, PNG or WebP>"}, got a JSON str'),
        ({"image": "x"}, "got keys ['image']"),
        ({"b64": "%%%"}, "b64 is not valid base64"),
        ([0] * 64, "got a JSON list"),
    ],
)
def test_instances_other_than_b64_images_are_named(core, item, message):
    [response] = core.answer([Payload(items=[item], raw=False)])
    assert response.status == 400 and message in response.body["message"]


def test_text_as_a_raw_body_is_refused(core):
    with pytest.raises(RequestError, match="expected image bytes"):
        core.task.decode_raw("a text body")


def test_a_request_s_images_share_the_pixel_budget(model_dir):
    core = InferenceCore.load(model_dir, classifier_settings(max_request_pixels=3 * 600 * 400), torch.device("cpu"))
    coffee = b64(photograph_bytes("coffee.png"))  # 600x400
    [fits, over] = core.answer([Payload(items=[coffee] * 3, raw=False), Payload(items=[coffee] * 4, raw=False)])
    assert fits.status == 200 and len(fits.body["predictions"]) == 3
    assert over.status == 413 and "instances[3]" in over.body["message"] and "handler.max_request_pixels" in over.body["message"]


def test_top_k_and_the_labels_file_are_checked_at_load(model_dir, tmp_path):
    core = InferenceCore.load(model_dir, classifier_settings(top_k=3), torch.device("cpu"))
    [response] = raw_answers(core, photographs()[:1])
    assert len(response.body["top_k"]) == 3
    with pytest.raises(SettingsError, match="handler.top_k is 1001, but imagenet_classes.json names only 1000 classes"):
        InferenceCore.load(model_dir, classifier_settings(top_k=1001), torch.device("cpu"))
    with pytest.raises(SettingsError, match="handler.top_k must be a positive integer"):
        InferenceCore.load(model_dir, classifier_settings(top_k=0), torch.device("cpu"))
    with pytest.raises(FileNotFoundError, match="handler.labels_file"):
        InferenceCore.load(model_dir, classifier_settings(labels_file="missing.json"), torch.device("cpu"))
