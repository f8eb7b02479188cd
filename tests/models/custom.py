"""Models written only for the tests: a user's own modules, not gradbridge built-ins."""

from __future__ import annotations

from torch import nn


class Unscriptable(nn.Module):
    """A classifier whose forward uses a construct TorchScript rejects (try/except)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, x):
        try:
            return self.body(x)
        except RuntimeError:
            return self.body(x.float())


def unscriptable() -> nn.Module:
    return Unscriptable()


def two_layer_regressor() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 5), nn.Sigmoid(), nn.Linear(5, 1))


UNSCRIPTABLE_LINE = Unscriptable.forward.__code__.co_firstlineno + 1  # the `try:` line
