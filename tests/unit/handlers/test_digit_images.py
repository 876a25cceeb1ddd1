import io

import numpy as np
import pytest
from PIL import Image

from handlers.digit_images import image_to_grid
from handlers.errors import RequestError
from models.digits.samples import grid_png, held_out, scanned_png
from tests.malformed import png_header, truncated_png


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


def test_the_pixel_limit_is_checked_from_the_header_before_decoding():
    # 60000 x 60000 would take 14 GB to decode as RGBA; the header says so in 60 bytes.
    with pytest.raises(RequestError) as caught:
        image_to_grid(png_header(60000, 60000), max_pixels=1024 * 1024)
    assert caught.value.code == 413
    assert "image is 3600000000 pixels, over the limit of 1048576 pixels (handler.max_image_pixels)" in caught.value.message
    with pytest.raises(RequestError, match="image is 1025x1024 = 1049600 pixels, over the limit of 1048576") as caught:
        image_to_grid(png_header(1025, 1024), max_pixels=1024 * 1024)
    assert caught.value.code == 413


def test_an_image_at_the_pixel_limit_is_read():
    image = io.BytesIO()
    Image.new("L", (64, 16), 255).save(image, format="PNG")
    assert image_to_grid(image.getvalue(), max_pixels=64 * 16).sum() == 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (png_header(0, 5), "not a readable image: the format is not one of PNG, JPEG"),
        (truncated_png(), "not a readable image (OSError: image file is truncated)"),
        (png_header(8, 8, data=b"not zlib data"), "not a readable image"),
        (b"GIF89a" + b"\x00" * 20, "not a readable image"),
        (b"%!PS-Adobe-3.0 EPSF-3.0\n", "not a readable image: the format is not one of"),  # EPS would run Ghostscript
    ],
    ids=["zero width", "truncated", "corrupt pixel data", "corrupt GIF", "EPS"],
)
def test_broken_images_are_400s_naming_the_problem(data, message):
    with pytest.raises(RequestError) as caught:
        image_to_grid(data)
    assert caught.value.code == 400 and message in caught.value.message
