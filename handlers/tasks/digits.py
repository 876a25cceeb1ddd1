"""The digits task: handwritten digits as 8x8 grids in 0..16 (scikit-learn's scale) -> {"label", "scores"}.

Rows come from 64 numbers, an 8x8 list, or an image of any size (handlers/digit_images.py maps it to the grid).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from handlers.digit_images import DEFAULT_MAX_PIXELS, DEFAULT_MAX_REQUEST_PIXELS, GRID, image_to_grid
from handlers.errors import RequestError
from handlers.images import PixelBudget
from handlers.model_files import load_program
from handlers.tasks.base import B64_IMAGE, BINARY, Task, instances_body, require_positive

PIXELS = GRID * GRID
MAX_VALUE = 16.0
NUMBER_TYPES = {int, float}
# numpy's kinds of the same: signed and unsigned integers, floats (not bool, "b").
NUMBER_KINDS = {"i", "u", "f"}


@dataclass(frozen=True)
class DigitOptions:
    # The most pixels (width x height) an image may have; checked from its header, before decoding.
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    # The most pixels all images of one request may have together, each counted from its header before it is
    # decoded: bounds the time one request holds a worker (thousands of large images in one bulk request).
    max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS

    def check(self) -> None:
        require_positive(self, "max_image_pixels", "max_request_pixels")


PIXEL = {"type": "number", "minimum": 0, "maximum": MAX_VALUE}  # the digits data's ink, 0 to 16


class DigitClassification(Task):
    name = "digit_classification"
    Options = DigitOptions
    # Media types a raw body may be sent as (handlers/decoding.py RequestLimits).
    raw_media = ("image/", "application/octet-stream")
    request_bodies = {
        "application/json": instances_body(
            {
                "oneOf": [
                    {"type": "array", "items": PIXEL, "minItems": 64, "maxItems": 64},
                    {
                        "type": "array",
                        "items": {"type": "array", "items": PIXEL, "minItems": 8, "maxItems": 8},
                        "minItems": 8,
                        "maxItems": 8,
                    },
                    B64_IMAGE,
                ]
            }
        ),
        "image/png": BINARY,
    }

    def __init__(self, options: DigitOptions, budget: PixelBudget | None = None) -> None:
        self.options = options
        self.budget = budget

    def for_request(self) -> DigitClassification:
        """The decoders for one request (InferenceCore.decode): its images share one max_request_pixels budget."""
        return DigitClassification(self.options, PixelBudget(self.options.max_request_pixels))

    def load_model(self, model_path: Path, device: torch.device):
        # Pillow's own decompression-bomb guard, set for the process that serves this model (a TorchServe
        # worker serves one): it warns above this many pixels and refuses twice as many, wherever an image opens.
        Image.MAX_IMAGE_PIXELS = self.options.max_image_pixels
        return load_program(model_path, device)

    def decode_raw(self, body: bytes | str) -> np.ndarray:
        if isinstance(body, str):
            raise RequestError('expected image bytes (or JSON {"instances": [...]}), got text')
        return image_to_grid(body, self.options.max_image_pixels, self.budget)

    GRAPH_EXAMPLE_ITEM = [0] * 64  # decoded once to capture CUDA graphs (handlers/cuda_graphs.py)

    def decode_instance(self, item: Any) -> np.ndarray:
        if isinstance(item, np.ndarray):  # a row of an npy body or a columnar input (Parquet): checked as its list
            if item.size > PIXELS:  # named without a Python object per value
                raise RequestError(f"expected 64 values in 0..16 (or an 8x8 list), got {item.size}")
            item = item.tolist()
        if isinstance(item, dict):
            return self._decode_b64(item)
        if not isinstance(item, list):
            raise RequestError(f'expected 64 numbers, an 8x8 list or {{"b64": ...}}, got {type(item).__name__}')
        values = _flatten_grid(item)
        if len(values) != PIXELS:
            raise RequestError(f"expected 64 values in 0..16 (or an 8x8 list), got {len(values)}")
        # Fast path, one numpy pass: only ints and floats (bool is neither here), all finite and in range.
        # The loop below runs only to name the first bad value.
        if set(map(type, values)) <= NUMBER_TYPES:
            grid = np.asarray(values, dtype=np.float64)
            if np.isfinite(grid).all() and grid.min() >= 0 and grid.max() <= MAX_VALUE:
                return grid.astype(np.float32).reshape(GRID, GRID)
        for value in values:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or not 0 <= value <= MAX_VALUE
            ):
                raise RequestError(f"expected 64 values in 0..16, got {value!r}")
        return np.asarray(values, dtype=np.float32).reshape(GRID, GRID)

    def decode_many(self, items: Sequence[Any]) -> list[np.ndarray] | None:
        """A whole request's instances in a few numpy passes, when every one is a list of 64 ints/floats (or a numpy
        row of 64 numbers: an npy body's, a columnar batch-job input's), all finite and in 0..16 (a batch job's rows): the same
        float32 grids decode_instance gives each. None when any item is anything else (8x8 lists, images, a bad
        value): the core then decodes item by item and names the first bad one.
        """
        if isinstance(items, np.ndarray):  # the rows of an npy body: one array already
            if items.shape[1:] != (PIXELS,) or items.dtype.kind not in NUMBER_KINDS:
                return None
            grids = items.astype(np.float64)
        elif set(map(type, items)) == {np.ndarray}:  # rows of a columnar batch-job input: no Python value per pixel
            if {item.shape for item in items} != {(PIXELS,)} or not {item.dtype.kind for item in items} <= NUMBER_KINDS:
                return None
            grids = np.stack(items).astype(np.float64)
        else:
            if set(map(type, items)) != {list} or set(map(len, items)) != {PIXELS}:
                return None
            if not set(map(type, itertools.chain.from_iterable(items))) <= NUMBER_TYPES:
                return None
            try:
                grids = np.array(items, dtype=np.float64)
            except (OverflowError, ValueError):  # an int too large for a float: the item by item path says which
                return None
        if not (np.isfinite(grids).all() and grids.min() >= 0 and grids.max() <= MAX_VALUE):
            return None
        return list(grids.astype(np.float32).reshape(len(items), GRID, GRID))

    def _decode_b64(self, item: dict) -> np.ndarray:
        if set(item) != {"b64"} or not isinstance(item["b64"], str):
            raise RequestError(f'expected {{"b64": "<base64 image>"}}, got keys {sorted(item)}')
        try:
            data = base64.b64decode(item["b64"], validate=True)
        except binascii.Error as error:
            raise RequestError(f"b64 is not valid base64: {error}") from None
        return image_to_grid(data, self.options.max_image_pixels, self.budget)

    def collate(self, rows: Sequence[np.ndarray], pad_to: int | None) -> torch.Tensor:
        batch = torch.from_numpy(np.stack(rows)).unsqueeze(1)  # (N, 1, 8, 8)
        if pad_to is not None and pad_to > len(rows):
            padding = torch.zeros((pad_to - len(rows), 1, GRID, GRID), dtype=batch.dtype)
            batch = torch.cat([batch, padding])
        return batch

    def forward(self, model, batch: torch.Tensor) -> torch.Tensor:
        return model(batch)

    def unbatch(self, outputs: torch.Tensor, rows: Sequence[np.ndarray]) -> list[dict]:
        scores = outputs.tolist()
        labels = outputs.argmax(dim=1).tolist()
        return [{"label": label, "scores": row} for label, row in zip(labels, scores, strict=True)]

    def row_cost(self, row: np.ndarray) -> int:
        return 1


def _flatten_grid(item: list) -> list:
    if len(item) == GRID and all(isinstance(row, list) for row in item):
        if any(len(row) != GRID for row in item):
            raise RequestError(f"expected an 8x8 list, got rows of lengths {[len(row) for row in item]}")
        return [value for row in item for value in row]
    return item
