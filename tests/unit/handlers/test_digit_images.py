import numpy as np
import pytest

from handlers.digit_images import image_to_grid
from handlers.errors import RequestError
from models.digits.samples import grid_png, held_out, scanned_png


def test_an_8x8_png_of_a_grid_gives_the_grid_back():
    grids, _ = held_out(20)
    for grid in grids:
        np.testing.assert_allclose(image_to_grid(grid_png(grid)), grid, atol=16 / 255)


@pytest.mark.parametrize("colour", [True, False])
@pytest.mark.parametrize("dark_ink", [True, False])
def test_larger_images_of_either_polarity_map_close_to_the_grid(colour, dark_ink):
    grids, _ = held_out(50)
    errors = [np.abs(image_to_grid(scanned_png(g, colour=colour, dark_ink=dark_ink)) - g).mean() for g in grids]
    assert np.mean(errors) < 1.5  # out of 16: same shape, slightly different stroke sampling


def test_blank_paper_is_an_empty_grid():
    assert image_to_grid(scanned_png(np.zeros((8, 8)))).sum() == 0


def test_not_an_image_is_a_400():
    with pytest.raises(RequestError, match="not a readable image") as caught:
        image_to_grid(b"hello")
    assert caught.value.code == 400
