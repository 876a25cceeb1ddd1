"""Every format of both models, built once under build/ (as `make archive FORMAT=...` builds them), and
the references the per-format tests compare against: the eager digits CNN and sentence-transformers."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from handlers.core import InferenceCore
from handlers.decoding import Payload
from handlers.settings import HandlerSettings
from models.digits import archive as digits_archive
from models.digits.formats import eager_from_program
from models.digits.samples import held_out
from models.minilm import archive as minilm_archive
from scripts.layout import ROOT

BUILD = ROOT / "build"
MINILM_CONFIG = ROOT / "models" / "minilm" / "model-config.yaml"
CPU = torch.device("cpu")


@functools.cache
def digits_file(fmt: str, precision: str = "fp32") -> Path:
    """build/digits/1.0/<file> for the format (converted from digits.pt2 on first use, then cached)."""
    return digits_archive.artifacts("1.0", BUILD, fmt, precision)[0]


@functools.cache
def minilm_file(fmt: str, precision: str = "fp32") -> Path:
    return minilm_archive.artifacts("1.0", BUILD, fmt, precision)[0]


def format_digits_core(
    model_file: Path, device: torch.device = CPU, precision: str = "fp32", max_batch_rows: int = 128
) -> InferenceCore:
    # 128 rows per pass: the 360 held-out rows run as passes of 128, 128 and 104 (the batch axis is dynamic).
    handler = {
        "task": "digit_classification",
        "model_file": model_file.name,
        "max_batch_rows": max_batch_rows,
        "precision": precision,
    }
    return InferenceCore.load(model_file.parent, HandlerSettings.from_yaml({"handler": handler}), device)


def format_minilm_core(model_file: Path, device: torch.device = CPU, precision: str = "fp32") -> InferenceCore:
    handler = {**yaml.safe_load(MINILM_CONFIG.read_text())["handler"], "model_file": model_file.name, "precision": precision}
    return InferenceCore.load(model_file.parent, HandlerSettings.from_yaml({"handler": handler}), device)


def predictions(core: InferenceCore, items: list) -> list[dict]:
    [response] = core.answer([Payload(items=items, raw=False)])
    assert response.status == 200, response.body
    return response.body["predictions"]


def digits_scores(core: InferenceCore, grids: np.ndarray) -> np.ndarray:
    return np.array([p["scores"] for p in predictions(core, [g.tolist() for g in grids])])


def minilm_embeddings(core: InferenceCore, texts: list[str]) -> np.ndarray:
    return np.array([p["embedding"] for p in predictions(core, texts)])


@pytest.fixture(scope="session")
def held_out_digits() -> tuple[np.ndarray, np.ndarray]:
    return held_out()


@pytest.fixture(scope="session")
def eager_digit_scores(held_out_digits) -> np.ndarray:
    """The eager CNN (weights from digits.pt2) on the held-out split: the reference for every format."""
    model = eager_from_program(digits_file("export"))
    with torch.inference_mode():
        return model(torch.from_numpy(held_out_digits[0]).unsqueeze(1)).numpy()
