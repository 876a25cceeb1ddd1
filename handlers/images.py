"""Image bytes from a client -> a decoded RGB picture, refusing what should not be decoded before decoding it.

The shared hardened decoder of every image task: the format is read from the file's first bytes and must be on the
task's allow-list (no other Pillow plugin ever parses the bytes); the size comes from the header and is checked
against a per-image and a per-request pixel budget before a pixel is decoded; Pillow's own decompression-bomb guard
stays on; only the first frame of an animated file is decoded; a truncated file is an error, never grey filler.
Every refusal is a RequestError (a 4xx) naming what was wrong and what is accepted.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from handlers.errors import RequestError, too_large, unsupported_media

# Photographs come as these; each further format is one more parser facing hostile bytes.
PHOTO_FORMATS = ("JPEG", "PNG", "WEBP")
FORMAT_NAMES = {"JPEG": "JPEG", "PNG": "PNG", "WEBP": "WebP"}
# First bytes of the formats a client may send by mistake, so the refusal can name what it got.
_SIGNATURES = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"%PDF", "PDF"),
    (b"%!PS", "EPS"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
)
_FTYP_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"avif": "AVIF"}
# Modes Pillow's convert("RGB") maps as torchvision's image loader does (alpha dropped, CMYK inverted, palette looked up).
_CONVERTIBLE = {"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr"}
# 16-bit grey: Pillow's convert clips it at 255 (a white picture), so it is scaled to 8 bits here instead.
_SIXTEEN_BIT = {"I;16", "I;16B", "I;16L", "I;16N", "I"}


class PixelBudget:
    """The pixels the images of one request may still have together (handler.max_request_pixels)."""

    def __init__(self, pixels: int) -> None:
        self.limit = self.left = pixels

    def charge(self, pixels: int) -> None:
        if pixels > self.left:
            raise too_large(
                f"the images of this request have more than {self.limit} pixels together (handler.max_request_pixels): "
                "send fewer or smaller images per request"
            )
        self.left -= pixels


def check_size(width: int, height: int, max_pixels: int) -> None:
    """An image's header size against handler.max_image_pixels: a 413 above it, a 400 for an empty picture."""
    if width * height > max_pixels:
        raise too_large(
            f"image is {width}x{height} = {width * height} pixels, over the limit of {max_pixels} pixels "
            "(handler.max_image_pixels): downscale it"
        )
    if width == 0 or height == 0:
        raise RequestError(f"image is {width}x{height}: it has no pixels")


def sniff_format(data: bytes) -> str | None:
    """The image format named by the file's first bytes (JPEG, PNG, WEBP, GIF, ...), or None when none matches."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[4:8] == b"ftyp" and data[8:12] in _FTYP_BRANDS:
        return _FTYP_BRANDS[data[8:12]]
    return next((name for signature, name in _SIGNATURES if data.startswith(signature)), None)


def accepted(formats: Sequence[str]) -> str:
    return ", ".join(FORMAT_NAMES.get(name, name) for name in formats)


def decode_rgb(
    data: bytes, max_pixels: int, budget: PixelBudget | None = None, formats: Sequence[str] = PHOTO_FORMATS
) -> Image.Image:
    """Image bytes -> a decoded RGB image (its first frame), checked from the header before decoding.

    Refused with a RequestError: no bytes (400); a format off `formats` (415, naming the accepted ones); bytes of no
    known format (400); over `max_pixels` or over what is left of `budget` (413); truncated or corrupt (400)."""
    if len(data) == 0:
        raise RequestError(f"empty image: no bytes were sent; send a {accepted(formats)} file")
    found = sniff_format(data)
    if found is None:
        raise RequestError(f"not an image: the bytes are none of {accepted(formats)} (their first bytes match no image format)")
    if found not in formats:
        raise unsupported_media(f"image format {FORMAT_NAMES.get(found, found)} is not accepted: send {accepted(formats)}")
    image = _open(data, found, max_pixels)
    check_size(image.width, image.height, max_pixels)
    if budget is not None:
        budget.charge(image.width * image.height)
    _load(image, found)
    return _to_rgb(image)


def bomb_refused(error: Image.DecompressionBombError, max_pixels: int) -> RequestError:
    """Pillow's own bomb guard tripped (above twice Image.MAX_IMAGE_PIXELS): the 413 that names the limit."""
    pixels = re.search(r"\((\d+) pixels\)", str(error))
    size = f"{pixels.group(1)} pixels" if pixels else "too large"
    return too_large(f"image is {size}, over the limit of {max_pixels} pixels (handler.max_image_pixels): downscale it")


def _open(data: bytes, found: str, max_pixels: int) -> Image.Image:
    """Image.open with the one plugin the first bytes named: it reads the header only."""
    try:
        # Pillow's bomb guard (Image.MAX_IMAGE_PIXELS, which image tasks set to their limit) warns above it, where
        # check_size refuses the image with a clearer message, and raises above twice it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data), formats=[found])
    except Image.DecompressionBombError as error:
        raise bomb_refused(error, max_pixels) from None
    except UnidentifiedImageError:
        raise RequestError(f"not a readable {FORMAT_NAMES[found]} image: its header is corrupt") from None
    except Exception as error:  # noqa: BLE001 - Pillow's plugins raise OSError, SyntaxError, ValueError, ...
        raise RequestError(f"not a readable {FORMAT_NAMES[found]} image ({type(error).__name__}: {str(error)[:200]})") from None


def _load(image: Image.Image, found: str) -> None:
    """Decode the current (first) frame; later frames of an animated PNG or WebP are never read."""
    try:
        image.load()
    except OSError as error:
        if "truncated" in str(error):
            raise RequestError(f"{FORMAT_NAMES[found]} image is truncated ({error}): send the whole file") from None
        raise RequestError(f"{FORMAT_NAMES[found]} image is corrupt ({type(error).__name__}: {str(error)[:200]})") from None
    except Exception as error:  # noqa: BLE001 - a decoder's SyntaxError, ValueError, zlib.error, ...
        raise RequestError(f"{FORMAT_NAMES[found]} image is corrupt ({type(error).__name__}: {str(error)[:200]})") from None


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in _SIXTEEN_BIT:
        # The high byte, as Pillow reads 16-bit colour PNGs: 16-bit grey v becomes 8-bit v >> 8.
        grey = (np.asarray(image).astype(np.uint32) >> 8).clip(0, 255).astype(np.uint8)
        return Image.fromarray(grey).convert("RGB")
    if image.mode in _CONVERTIBLE:
        return image.convert("RGB")
    raise unsupported_media(f"image mode {image.mode} cannot be read as RGB: send an 8-bit or 16-bit grey or colour image")
