import base64

import numpy as np
import pytest

from handlers.errors import RequestError
from handlers.tasks.digits import DigitClassification, DigitOptions
from models.digits.samples import grid_png, held_out

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
