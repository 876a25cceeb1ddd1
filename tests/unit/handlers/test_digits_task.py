import base64

import numpy as np
import pytest
import torch

from handlers.core import InferenceCore
from handlers.decoding import Payload
from handlers.errors import RequestError
from handlers.settings import HandlerSettings
from handlers.tasks.digits import DigitClassification, DigitOptions
from models.digits.samples import grid_png, held_out
from tests.malformed import png_header

TASK = DigitClassification(DigitOptions())


def test_flat_nested_and_b64_instances_decode_to_the_same_grid():
    grid = held_out(1)[0][0]
    flat = TASK.decode_instance(grid.flatten().tolist())
    nested = TASK.decode_instance(grid.tolist())
    b64 = TASK.decode_instance({"b64": base64.b64encode(grid_png(grid)).decode()})
    np.testing.assert_array_equal(flat, nested)
    np.testing.assert_allclose(b64, flat, atol=16 / 255)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ([1] * 63, "expected 64 values in 0..16 \\(or an 8x8 list\\), got 63"),
        ([1] * 63 + [17], "expected 64 values in 0..16, got 17"),
        ([1] * 63 + [True], "got True"),
        ([1] * 63 + ["3"], "got '3'"),
        ([[1] * 8] * 7 + [[1] * 7], "expected an 8x8 list, got rows of lengths"),
        ("abc", "got str"),
        ({"b64": "!!"}, "not valid base64"),
        ({"image": "x"}, 'expected {"b64"'),
    ],
)
def test_bad_instances_say_what_is_expected(item, message):
    with pytest.raises(RequestError, match=message):
        TASK.decode_instance(item)


def test_collate_pads_to_a_fixed_batch_in_deterministic_mode():
    rows = [np.ones((8, 8), dtype=np.float32)] * 3
    assert TASK.collate(rows, None).shape == (3, 1, 8, 8)
    padded = TASK.collate(rows, 8)
    assert padded.shape == (8, 1, 8, 8) and padded[3:].abs().sum() == 0


def test_the_images_of_one_request_share_a_pixel_budget_checked_from_their_headers():
    task = DigitClassification(DigitOptions(max_image_pixels=100 * 100, max_request_pixels=3 * 100 * 100))
    settings = HandlerSettings.from_yaml({"handler": {"task": task.name, "model_file": "digits.pt2"}})
    core = InferenceCore(task, model=None, device=torch.device("cpu"), settings=settings)  # decoding needs no model
    image = {"b64": base64.b64encode(png_header(100, 100)).decode()}
    assert len(core.decode(Payload(items=[image] * 3, raw=False))) == 3
    with pytest.raises(RequestError) as caught:
        core.decode(Payload(items=[image] * 4, raw=False))
    assert caught.value.code == 413
    assert caught.value.message == (
        "instances[3]: the images of this request have more than 30000 pixels together (handler.max_request_pixels): "
        "send fewer or smaller images per request"
    )
    # Each request has its own budget.
    assert len(core.decode(Payload(items=[image] * 3, raw=False))) == 3
