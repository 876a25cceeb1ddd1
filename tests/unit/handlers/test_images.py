"""The shared image decoder (handlers/images.py): what it decodes, how, and what it refuses before decoding."""

from __future__ import annotations

import functools
import io
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from handlers.errors import RequestError
from handlers.images import PixelBudget, decode_rgb, sniff_format
from tests.malformed import png_header

LIMIT = 4096 * 4096


def photograph_bytes(name: str) -> bytes:
    """One of the photographs scikit-image's wheel ships, as a client would send it."""
    import skimage.data  # located only: the files sit beside it

    return (Path(skimage.data.__file__).resolve().parent / name).read_bytes()


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


@functools.cache
def chelsea() -> Image.Image:
    return Image.open(io.BytesIO(photograph_bytes("chelsea.png"))).convert("RGB")


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image)


def refused(data: bytes, max_pixels: int = LIMIT, budget: PixelBudget | None = None) -> RequestError:
    with pytest.raises(RequestError) as caught:
        decode_rgb(data, max_pixels, budget)
    return caught.value


@functools.cache
def gif_of_frames(frames: int) -> bytes:
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)) for _ in range(frames)]
    return encoded(images[0], "GIF", save_all=True, append_images=images[1:])


@functools.cache
def png_bomb(side: int) -> bytes:
    """A real grey PNG of side x side black pixels: a few tens of KB that decode to side² bytes (a bomb)."""
    compressor = zlib.compressobj(9)
    row = b"\x00" * (side + 1)  # filter byte + a row of zeros
    data = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    return png_header(side, side, data)


def test_png_jpeg_and_webp_decode_to_rgb_with_the_header_s_size():
    for fmt, options in (("PNG", {}), ("JPEG", {"quality": 95}), ("WEBP", {"lossless": True})):
        data = encoded(chelsea(), fmt, **options)
        image = decode_rgb(data, LIMIT)
        assert (image.mode, image.size, sniff_format(data)) == ("RGB", (451, 300), fmt)
        if fmt != "JPEG":  # lossless: the same pixels
            assert np.array_equal(pixels(image), pixels(chelsea()))


def test_formats_off_the_allow_list_are_a_415_naming_the_accepted_ones():
    for fmt in ("GIF", "BMP", "TIFF"):
        error = refused(encoded(chelsea(), fmt))
        assert (error.code, error.type) == (415, "UnsupportedMediaType")
        assert error.message == f"image format {fmt} is not accepted: send JPEG, PNG, WebP"


def test_a_gif_of_1000_frames_is_refused_from_its_first_bytes():
    data = gif_of_frames(1000)
    assert Image.open(io.BytesIO(data)).n_frames == 1000  # a real animation, refused without being parsed
    error = refused(data)
    assert error.code == 415 and "GIF" in error.message


def test_text_is_not_an_image():
    error = refused(b"hello, this is not a picture at all")
    assert error.code == 400
    assert error.message.startswith("not an image: the bytes are none of JPEG, PNG, WebP")


def test_no_bytes_is_a_clear_400():
    error = refused(b"")
    assert (error.code, error.message) == (400, "empty image: no bytes were sent; send a JPEG, PNG, WebP file")


def test_a_30000_by_30000_header_is_refused_before_decoding():
    error = refused(png_header(30000, 30000))
    assert error.code == 413
    # Named by Pillow's bomb guard (above twice Image.MAX_IMAGE_PIXELS) or by the header check, in the same words.
    assert "900000000 pixels, over the limit of 16777216 pixels (handler.max_image_pixels)" in error.message


def test_a_decompression_bomb_is_refused_from_its_header():
    bomb = png_bomb(8192)  # 67 megapixels of zeros in a few KB
    assert len(bomb) < 200_000
    error = refused(bomb)
    # Whichever refuses it first (Pillow's guard, set process-wide by an image task, or the header check): same words.
    assert error.code == 413 and "67108864 pixels, over the limit of 16777216 pixels" in error.message


def test_pillow_s_own_bomb_guard_answers_413_too(monkeypatch):
    # Above twice Image.MAX_IMAGE_PIXELS, Image.open itself raises (before our header check can): still a 413.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    error = refused(png_bomb(64), max_pixels=1000)
    assert error.code == 413 and "4096 pixels, over the limit of 1000 pixels" in error.message


def test_a_request_s_images_share_one_pixel_budget():
    data = encoded(chelsea(), "PNG")
    budget = PixelBudget(2 * 451 * 300)
    decode_rgb(data, LIMIT, budget)
    decode_rgb(data, LIMIT, budget)
    error = refused(data, budget=budget)
    assert error.code == 413 and "handler.max_request_pixels" in error.message


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_a_truncated_file_is_a_400_that_says_so(fmt):
    data = encoded(chelsea(), fmt)
    error = refused(data[: len(data) // 2])
    assert error.code == 400
    assert "truncated" in error.message or "corrupt" in error.message
    assert error.message.startswith(f"{fmt} image is")


def test_a_truncated_jpeg_names_the_truncation():
    data = photograph_bytes("rocket.jpg")
    error = refused(data[: len(data) // 2])
    assert error.message.startswith("JPEG image is truncated (image file is truncated")


def test_a_corrupt_header_is_a_400():
    error = refused(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    assert error.code == 400 and error.message.startswith("not a readable PNG image")


def test_cmyk_jpeg_is_converted_as_pillow_does():
    cmyk = chelsea().convert("CMYK")
    image = decode_rgb(encoded(cmyk, "JPEG", quality=95), LIMIT)
    assert image.mode == "RGB"
    # Pillow's CMYK -> RGB undoes its RGB -> CMYK: the picture comes back, up to JPEG's loss.
    assert np.abs(pixels(image).astype(int) - pixels(chelsea())).mean() < 4


def test_16_bit_grey_png_is_scaled_to_8_bits_not_clipped():
    grey = np.asarray(chelsea().convert("L"), dtype=np.uint16)
    image = decode_rgb(encoded(Image.fromarray(grey * 257), "PNG"), LIMIT)  # 0..255 -> 0..65535
    assert image.mode == "RGB"
    assert np.array_equal(pixels(image)[..., 0], grey.astype(np.uint8))
    assert np.array_equal(pixels(image), pixels(Image.fromarray(grey.astype(np.uint8)).convert("RGB")))


@pytest.mark.parametrize("mode", ["L", "LA", "P", "RGBA", "1"])
def test_other_modes_become_rgb_as_torchvision_s_loader_makes_them(mode):
    source = chelsea().convert(mode)
    image = decode_rgb(encoded(source, "PNG"), LIMIT)
    assert image.mode == "RGB" and image.size == source.size
    assert np.array_equal(pixels(image), pixels(source.convert("RGB")))  # alpha dropped, palette looked up


def test_an_animated_png_is_read_from_its_first_frame():
    noise = [Image.fromarray(np.random.default_rng(i).integers(0, 255, (300, 451, 3), dtype=np.uint8)) for i in range(5)]
    data = encoded(chelsea(), "PNG", save_all=True, append_images=noise)
    assert Image.open(io.BytesIO(data)).n_frames == 6
    assert np.array_equal(pixels(decode_rgb(data, LIMIT)), pixels(chelsea()))
