"""Held-out digits as the payloads clients send: JSON grids and PNG bytes in several looks (tests, benchmarks, verify)."""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from models.digits.data import load_split


def held_out(count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    split = load_split()
    return split.test_x[:count], split.test_y[:count]


def grid_png(grid: np.ndarray) -> bytes:
    """The 8x8 grid itself as an 8x8 greyscale PNG, light ink on black like the dataset."""
    return _png(Image.fromarray((grid * 255.0 / 16.0).round().astype(np.uint8), mode="L"))


def scanned_png(grid: np.ndarray, scale: int = 12, colour: bool = True, dark_ink: bool = True) -> bytes:
    """A larger picture of the digit: upscaled, optionally RGB, dark ink on light paper with a margin."""
    ink = np.kron(grid / 16.0, np.ones((scale, scale)))
    ink = np.pad(ink, scale * 2)
    pixels = ((1.0 - ink) if dark_ink else ink) * 255.0
    image = Image.fromarray(pixels.round().astype(np.uint8), mode="L")
    return _png(image.convert("RGB") if colour else image)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
