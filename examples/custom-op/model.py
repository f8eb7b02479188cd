"""Models that call the custom operator gbops::scaled_tanh (examples/custom-op/scaled_tanh.cpp).

Load the library before scripting or exporting them:
``torch.ops.load_library("build/ops/libgbops.so")``, or ``gradbridge export ... --op-library``.
"""

import torch
from torch import nn


class TanhRegressor(nn.Module):
    """Linear -> gbops::scaled_tanh(alpha) -> Linear."""

    def __init__(self, features: int = 3, hidden: int = 8, alpha: float = 2.0):
        super().__init__()
        self.hidden = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, 1)
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.ops.gbops.scaled_tanh(self.hidden(x), self.alpha))


class BadGradTanhRegressor(TanhRegressor):
    """The same model on gbops::scaled_tanh_bad_grad, whose backward is wrong on purpose."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.ops.gbops.scaled_tanh_bad_grad(self.hidden(x), self.alpha))


def tanh_regressor() -> nn.Module:
    return TanhRegressor()


def bad_grad_tanh_regressor() -> nn.Module:
    return BadGradTanhRegressor()
