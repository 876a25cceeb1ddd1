"""Map an image of a handwritten digit (any size, grey or colour, either polarity) to the 8x8, 0..16 grid
of scikit-learn's digits, the scale the model was trained on."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from handlers.errors import RequestError

GRID = 8
# scikit-learn's digits are 32x32 bitmaps counted in 4x4 blocks: each cell is 0..16 inked pixels.
BITMAP = 32
MAX_PIXELS = 4096 * 4096


def image_to_grid(data: bytes) -> np.ndarray:
    """Image bytes -> float32 array (8, 8) in 0..16, ink high, background 0."""
    grey = _open_grey(data)
    ink = _ink_intensity(grey)
    if grey.shape == (GRID, GRID):
        return (ink * 16.0).astype(np.float32)
    return _fit_to_grid(ink)


def _open_grey(data: bytes) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > MAX_PIXELS:
                raise RequestError(f"image is {image.width}x{image.height} pixels; at most {MAX_PIXELS} pixels are accepted")
            image = image.convert("RGBA")
            # Transparent pixels are paper: composite onto white before going grey.
            paper = Image.new("RGBA", image.size, (255, 255, 255, 255))
            return np.asarray(Image.alpha_composite(paper, image).convert("L"), dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as error:
        raise RequestError(f"body is not a readable image (PNG, JPEG, BMP, ...): {error}") from None


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
