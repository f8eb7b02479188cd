"""Built-in models that `gradbridge export NAME` knows by name."""

from __future__ import annotations

from typing import Callable, Dict

import torch
from torch import nn


class LinearRegression(nn.Module):
    """The seed's model: ``y = weight * x + bias`` with ``weight ~ N(0, 1)``, ``bias = 0``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x + self.bias


#: name -> factory. Each factory builds a fresh model from torch's current RNG state.
BUILTIN_MODELS: Dict[str, Callable[[], nn.Module]] = {
    "linear-regression": LinearRegression,
}
