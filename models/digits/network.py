"""The digits CNN. It takes raw 0..16 grids and returns class probabilities, so every caller gets the same scores."""

from __future__ import annotations

import torch
from torch import nn


class DigitsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))

    def logits(self, grids: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(grids / 16.0))

    def forward(self, grids: torch.Tensor) -> torch.Tensor:
        """(N, 1, 8, 8) grids in 0..16 -> (N, 10) probabilities."""
        return torch.softmax(self.logits(grids), dim=1)
