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


def test_plain_rows_decode_at_once_to_the_grids_of_item_by_item():
    grids = held_out(5)[0]
    items = [grid.flatten().tolist() for grid in grids]
    items[1] = [float(v) + 0.25 if v < 16 else 16.0 for v in items[1]]  # floats, and ints and floats mixed below
    items[2][0] = 0.5
    many = TASK.decode_many(items)
    assert many is not None and len(many) == 5
    for row, item in zip(many, items, strict=True):
        assert row.dtype == np.float32 and row.shape == (8, 8)
        np.testing.assert_array_equal(row, TASK.decode_instance(item))


def test_numpy_rows_of_a_columnar_input_decode_like_their_lists():
    """Rows of a Parquet batch-job input come as numpy rows (scripts/jobs/inputs.py): the same grids at once, and a
    bad value named as in the list it stands for."""
    items = [grid.flatten().tolist() for grid in held_out(4)[0]]
    for dtype in (np.int64, np.float64, np.uint8):
        rows = list(np.array(items, dtype=dtype))
        many = TASK.decode_many(rows)
        assert many is not None and len(many) == 4
        for row, item in zip(many, items, strict=True):
            np.testing.assert_array_equal(row, TASK.decode_many([item, item])[0])
            np.testing.assert_array_equal(TASK.decode_instance(np.array(item, dtype=dtype)), row)
    bad = [np.array([0] * 63 + [17]), np.array([0] * 63 + [17.0]), np.array([True] * 64), np.zeros(63, dtype=np.int64)]
    for row, message in zip(bad, ["got 17$", "got 17.0$", "got True$", "got 63$"], strict=True):
        assert TASK.decode_many([np.zeros(64, dtype=row.dtype), row]) is None
        with pytest.raises(RequestError, match=message):
            TASK.decode_instance(row)


def test_the_rows_of_an_npy_body_decode_at_once_like_their_lists():
    """An application/x-npy body's rows come as one array (handlers/decoding.py): the grids the lists give, or None
    (item by item) for another shape, a non-number dtype or a value out of range."""
    items = [grid.flatten().tolist() for grid in held_out(4)[0]]
    for dtype in (np.int64, np.float32, np.uint8):
        many = TASK.decode_many(np.array(items, dtype=dtype))
        assert many is not None and len(many) == 4
        np.testing.assert_array_equal(np.stack(many), np.stack(TASK.decode_many(items)))
    for odd in (np.zeros((2, 8, 8)), np.zeros((2, 63)), np.ones((2, 64), bool), np.full((2, 64), 16.5)):
        assert TASK.decode_many(odd) is None
    with pytest.raises(RequestError, match=r"expected 64 values in 0..16 \(or an 8x8 list\), got 100000$"):
        TASK.decode_instance(np.zeros(100_000))  # named from its size, without a Python number per value
    np.testing.assert_array_equal(TASK.decode_instance(np.zeros((8, 8), np.int64)), np.zeros((8, 8), np.float32))


@pytest.mark.parametrize(
    "odd",
    [
        [1] * 63 + [17],
        [1] * 63 + [True],
        [1] * 63 + ["3"],
        [1] * 63 + [float("nan")],
        [1] * 63 + [10**400],
        [1] * 63 + [-1],
        [1] * 63,
        [[1] * 8] * 8,
        {"b64": "x"},
        "abc",
    ],
)
def test_any_other_item_leaves_decoding_to_the_item_by_item_path(odd):
    assert TASK.decode_many([[0] * 64, odd]) is None


def test_a_bad_row_among_plain_ones_is_named_as_before():
    settings = HandlerSettings.from_yaml({"handler": {"task": TASK.name, "model_file": "digits.pt2"}})
    core = InferenceCore(TASK, model=None, device=torch.device("cpu"), settings=settings)
    with pytest.raises(RequestError, match=r"instances\[2\]: expected 64 values in 0..16, got 17"):
        core.decode(Payload(items=[[0] * 64, [16] * 64, [0] * 63 + [17]], raw=False))
    assert len(core.decode(Payload(items=[[0] * 64, [16] * 64], raw=False))) == 2


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
