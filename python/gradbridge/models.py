"""Built-in models that `gradbridge export NAME` knows by name.

Each factory builds a fresh model from torch's current RNG state; its keyword arguments size it.
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence

import torch
from torch import nn


#: The seed's learning rate (SGD on LinearRegression): `gradbridge export linear-regression`, the demo and
#: the bench use it; the Java seed example's --lr default is pinned to it (tests/test_pins.py).
SEED_LR = 0.01


class LinearRegression(nn.Module):
    """The seed's model: ``y = weight * x + bias`` with ``weight ~ N(0, 1)``, ``bias = 0``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x + self.bias


def linear(in_features: int = 10, out_features: int = 1) -> nn.Module:
    """A single Linear layer: linear or logistic regression (with a logits loss)."""
    return nn.Sequential(nn.Linear(in_features, out_features))


def mlp(in_features: int = 4, hidden: Sequence[int] = (16, 16), out_features: int = 3, dropout: float = 0.0) -> nn.Module:
    """Linear/ReLU layers (three Linear layers by default); dropout after each hidden ReLU if > 0."""
    layers = []
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = size
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


class SmallCNN(nn.Module):
    """Conv-BatchNorm-ReLU twice, then a Linear head; input [N, 1, side, side] (8x8 digits)."""

    def __init__(self, side: int = 8, channels: int = 8, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(channels * (side // 2) * (side // 2), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


class SharedWeights(nn.Module):
    """Two Linear layers that share one weight Parameter (separate biases), then a head.

    ``named_parameters()`` lists the shared weight once, so it is stepped once per update
    with the sum of the gradients from both uses, as in torch.optim.
    """

    def __init__(self, features: int = 4, classes: int = 3):
        super().__init__()
        self.first = nn.Linear(features, features)
        self.second = nn.Linear(features, features)
        self.second.weight = self.first.weight
        self.head = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.second(torch.relu(self.first(x)))))


BUILTIN_MODELS: Dict[str, Callable[..., nn.Module]] = {
    "linear-regression": LinearRegression,
    "linear": linear,
    "mlp": mlp,
    "small-cnn": SmallCNN,
    "shared-weights": SharedWeights,
}
