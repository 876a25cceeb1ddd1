"""scikit-learn's bundled handwritten digits with the one fixed train/held-out split every script uses."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

SPLIT_SEED = 0
HELD_OUT_FRACTION = 0.2


@dataclass(frozen=True)
class DigitsSplit:
    train_x: np.ndarray  # (N, 8, 8) float32 in 0..16
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray


def load_split() -> DigitsSplit:
    digits = load_digits()
    images = digits.images.astype(np.float32)
    train_x, test_x, train_y, test_y = train_test_split(
        images, digits.target, test_size=HELD_OUT_FRACTION, random_state=SPLIT_SEED, stratify=digits.target
    )
    return DigitsSplit(train_x, train_y.astype(np.int64), test_x, test_y.astype(np.int64))
