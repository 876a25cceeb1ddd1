"""The image classification task (ImageNet-1k): a JPEG, PNG or WebP photograph -> its top-k classes.

Each image is decoded by handlers/images.py (format allow-list, pixel budgets from the header), then prepared as
torchvision's standard evaluation transforms do on PIL images: the shorter side resized to 256 (PIL bilinear), the
centre 224x224 cropped. Rows are those uint8 crops; collate normalises a whole micro-batch in one tensor pass.
Answer: {"top_k": [{"index": int, "label": str, "probability": float}, ...]}, likeliest first, handler.top_k long.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from handlers.errors import RequestError, SettingsError
from handlers.images import PixelBudget, decode_rgb
from handlers.model_files import load_program
from handlers.tasks.base import B64_IMAGE, BINARY, Task, instances_body, require_positive

DEFAULT_LABELS_FILE = "imagenet_classes.json"
# torchvision's ImageNet evaluation transforms: Resize(256), CenterCrop(224), Normalize(mean, std).
RESIZE = 256
CROP = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# As (1, 3, 1, 1) tensors once: for_request builds a task per request, and collate only reads these.
MEAN_TENSOR = torch.tensor(MEAN, dtype=torch.float32).view(1, 3, 1, 1)
STD_TENSOR = torch.tensor(STD, dtype=torch.float32).view(1, 3, 1, 1)
# handler.max_image_pixels' default: a 16-megapixel photograph; decoding holds it as RGB (48 MB) and its resize.
DEFAULT_MAX_PIXELS = 4096 * 4096
# handler.max_request_pixels' default: all images of one request together, which bounds its decoding time.
DEFAULT_MAX_REQUEST_PIXELS = 16 * DEFAULT_MAX_PIXELS


def _example_png() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (CROP, CROP), (124, 116, 104)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass(frozen=True)
class ImageClassificationOptions:
    # A JSON list of the class names in the model's output order, shipped beside the model file in the archive.
    labels_file: str = DEFAULT_LABELS_FILE
    # Classes per answer, likeliest first.
    top_k: int = 5
    # The most pixels (width x height) an image may have; checked from its header, before decoding.
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    # The most pixels all images of one request may have together, each counted from its header before it is
    # decoded: bounds the time one request holds a worker.
    max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS

    def check(self) -> None:
        require_positive(self, "top_k", "max_image_pixels", "max_request_pixels")


class ImageClassification(Task):
    name = "image_classification"
    Options = ImageClassificationOptions
    # Media types a raw body may be sent as (handlers/decoding.py RequestLimits).
    raw_media = ("image/", "application/octet-stream")
    request_bodies = {
        "application/json": instances_body(B64_IMAGE),
        "image/jpeg": BINARY,
        "image/png": BINARY,
        "image/webp": BINARY,
    }

    def __init__(self, options: ImageClassificationOptions, budget: PixelBudget | None = None) -> None:
        self.options = options
        self.budget = budget
        self.labels: list[str] = []

    def for_request(self) -> ImageClassification:
        """The decoders for one request (InferenceCore.decode): its images share one max_request_pixels budget."""
        task = ImageClassification(self.options, PixelBudget(self.options.max_request_pixels))
        task.labels = self.labels
        return task

    def load_model(self, model_path: Path, device: torch.device):
        # Pillow's own decompression-bomb guard, set for the process that serves this model (a TorchServe worker
        # serves one): it warns above this many pixels and refuses twice as many, wherever an image opens.
        Image.MAX_IMAGE_PIXELS = self.options.max_image_pixels
        self.load_files(model_path.parent)
        return load_program(model_path, device)

    def load_files(self, folder: Path) -> None:
        self.labels = self._load_labels(folder / self.options.labels_file)

    def _load_labels(self, path: Path) -> list[str]:
        if not path.is_file():
            raise FileNotFoundError(f"labels file {path} not found in the archive (handler.labels_file)")
        labels = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(labels, list) or not labels or not all(isinstance(label, str) for label in labels):
            raise SettingsError(f"{path.name} must be a JSON list of class names (strings)")
        if self.options.top_k > len(labels):
            raise SettingsError(f"handler.top_k is {self.options.top_k}, but {path.name} names only {len(labels)} classes")
        return labels

    # -- decode ---------------------------------------------------------------------------------

    GRAPH_EXAMPLE_ITEM = {"b64": _example_png()}  # decoded once to capture CUDA graphs (handlers/cuda_graphs.py)

    def decode_raw(self, body: bytes | str) -> np.ndarray:
        if isinstance(body, str):
            raise RequestError('expected image bytes (JPEG, PNG or WebP; or JSON {"instances": [{"b64": ...}]}), got text')
        return self._prepared(bytes(body))

    def decode_instance(self, item: Any) -> np.ndarray:
        if not isinstance(item, dict) or set(item) != {"b64"} or not isinstance(item["b64"], str):
            got = f"keys {sorted(item)}" if isinstance(item, dict) else f"a JSON {type(item).__name__}"
            raise RequestError(f'expected {{"b64": "<base64 JPEG, PNG or WebP>"}}, got {got}')
        try:
            data = base64.b64decode(item["b64"], validate=True)
        except binascii.Error as error:
            raise RequestError(f"b64 is not valid base64: {error}") from None
        return self._prepared(data)

    def _prepared(self, data: bytes) -> np.ndarray:
        """Image bytes -> uint8 (224, 224, 3): the shorter side resized to 256, the centre cropped (torchvision's way)."""
        return self.resized_crop(self.decoded(data))

    def decoded(self, data: bytes) -> Image.Image:
        """Image bytes -> an RGB image, within the pixel budgets (handlers/images.py)."""
        return decode_rgb(data, self.options.max_image_pixels, self.budget)

    def resized_crop(self, image: Image.Image) -> np.ndarray:
        """RGB image -> uint8 (224, 224, 3): the shorter side resized to 256, the centre 224 x 224."""
        width, height = image.size
        short, long = min(width, height), max(width, height)
        new_long = int(RESIZE * long / short)
        size = (RESIZE, new_long) if width <= height else (new_long, RESIZE)
        if size != image.size:
            image = image.resize(size, Image.Resampling.BILINEAR)
        width, height = image.size
        top, left = int(round((height - CROP) / 2.0)), int(round((width - CROP) / 2.0))
        return np.asarray(image.crop((left, top, left + CROP, top + CROP)), dtype=np.uint8)

    # -- batch ----------------------------------------------------------------------------------

    def collate(self, rows: Sequence[np.ndarray], pad_to: int | None) -> torch.Tensor:
        """uint8 (N, 224, 224, 3) crops -> float32 (N, 3, 224, 224), scaled to 0..1 and normalised in one pass."""
        pixels = torch.from_numpy(np.stack(rows))
        if pad_to is not None and pad_to > len(rows):
            pixels = torch.cat([pixels, pixels.new_zeros((pad_to - len(rows), CROP, CROP, 3))])
        batch = pixels.permute(0, 3, 1, 2).contiguous().float()
        return batch.div_(255).sub_(MEAN_TENSOR).div_(STD_TENSOR)

    def forward(self, model, batch: torch.Tensor) -> torch.Tensor:
        return model(batch)

    def unbatch(self, outputs: torch.Tensor, rows: Sequence[np.ndarray]) -> list[dict]:
        probabilities, indexes = outputs.softmax(dim=1).topk(self.options.top_k, dim=1)
        return [
            {
                "top_k": [
                    {"index": i, "label": self.labels[i], "probability": p} for i, p in zip(row_indexes, row_probs, strict=True)
                ]
            }
            for row_indexes, row_probs in zip(indexes.tolist(), probabilities.tolist(), strict=True)
        ]

    def row_cost(self, row: np.ndarray) -> int:
        return 1
