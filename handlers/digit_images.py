"""Map an image of a handwritten digit (any size, grey or colour, either polarity) to the 8x8, 0..16 grid
of scikit-learn's digits, the scale the model was trained on."""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, UnidentifiedImageError

from handlers.errors import RequestError
from handlers.images import PixelBudget, bomb_refused, check_size

GRID = 8
# scikit-learn's digits are 32x32 bitmaps counted in 4x4 blocks: each cell is 0..16 inked pixels.
BITMAP = 32
# handler.max_image_pixels' default: decoding holds several copies of an image (RGBA, composited, float32).
DEFAULT_MAX_PIXELS = 1024 * 1024
# handler.max_request_pixels' default: all images of one request together, which bounds its decoding time.
DEFAULT_MAX_REQUEST_PIXELS = 16 * DEFAULT_MAX_PIXELS
# The formats a picture of a digit comes in. Pillow would otherwise try every plugin it has (EPS runs
# Ghostscript when installed), each one more parser facing hostile bytes.
FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP", "PPM")


def image_to_grid(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, budget: PixelBudget | None = None) -> np.ndarray:
    """Image bytes -> float32 array (8, 8) in 0..16, ink high, background 0. An image over `max_pixels`, or over
    what is left of its request's `budget`, is refused from its header, before a pixel is decoded."""
    grey = _open_grey(data, max_pixels, budget)
    ink = _ink_intensity(grey)
    if grey.shape == (GRID, GRID):
        return (ink * 16.0).astype(np.float32)
    return _fit_to_grid(ink)


def _open_grey(data: bytes, max_pixels: int, budget: PixelBudget | None) -> np.ndarray:
    try:
        # Image.open reads the header only. Pillow's own bomb check (Image.MAX_IMAGE_PIXELS, which the digits
        # task sets to the same limit) warns above it, where check_size refuses the image by its size, and
        # raises above twice it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
        with image:
            check_size(image.width, image.height, max_pixels)
            if budget is not None:
                budget.charge(image.width * image.height)
            image = image.convert("RGBA")
            # Transparent pixels are paper: composite onto white before going grey.
            paper = Image.new("RGBA", image.size, (255, 255, 255, 255))
            return np.asarray(Image.alpha_composite(paper, image).convert("L"), dtype=np.float32) / 255.0
    except Image.DecompressionBombError as error:
        raise bomb_refused(error, max_pixels) from None
    except UnidentifiedImageError:
        raise RequestError(f"not a readable image: the format is not one of {', '.join(FORMATS)}") from None
    except RequestError:
        raise
    except Exception as error:  # noqa: BLE001 - Pillow's decoders raise OSError, SyntaxError, ValueError, ...
        raise RequestError(f"not a readable image ({type(error).__name__}: {str(error)[:200]})") from None


def _ink_intensity(grey: np.ndarray) -> np.ndarray:
    """0..1 where 1 is ink. The paper is whatever dominates the border; dark paper means light ink."""
    border = np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]])
    return 1.0 - grey if float(np.median(border)) > 0.5 else grey


def _fit_to_grid(ink: np.ndarray) -> np.ndarray:
    """Crop to the ink, centre it in a square 32x32 bitmap (longest side filling it), count 4x4 blocks."""
    mask = ink > 0.25
    if not mask.any():
        return np.zeros((GRID, GRID), dtype=np.float32)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    crop = ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    height, width = crop.shape
    scale = BITMAP / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    resized = (
        np.asarray(Image.fromarray((crop * 255).astype(np.uint8)).resize(size, Image.Resampling.BOX), dtype=np.float32) / 255
    )
    bitmap = np.zeros((BITMAP, BITMAP), dtype=np.float32)
    top, left = (BITMAP - size[1]) // 2, (BITMAP - size[0]) // 2
    bitmap[top : top + size[1], left : left + size[0]] = resized
    return bitmap.reshape(GRID, 4, GRID, 4).sum(axis=(1, 3)).astype(np.float32)
