"""Real tiny pieces for unit tests: the exported digits model from the built archive's inputs, settings, cores."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from handlers.core import InferenceCore
from handlers.settings import HandlerSettings
from models.digits.archive import artifacts
from scripts.layout import BUILD


@pytest.fixture(scope="session")
def digits_model_dir() -> Path:
    """The folder holding digits.pt2 (trained on first use, as `make archive` does)."""
    return artifacts("1.0", BUILD)[0].parent


def digits_settings(**changes) -> HandlerSettings:
    handler = {"task": "digit_classification", "model_file": "digits.pt2", "max_batch_rows": 512, **changes}
    return HandlerSettings.from_yaml({"handler": handler})


@pytest.fixture(scope="session")
def digits_core(digits_model_dir) -> InferenceCore:
    return InferenceCore.load(digits_model_dir, digits_settings(), torch.device("cpu"))
