"""Models written only for the tests: a user's own modules, not gradbridge built-ins."""

from __future__ import annotations

import torch
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


class KeywordNet(nn.Module):
    """Like an HF transformers model: ``**kwargs`` in forward (TorchScript cannot script it), dropout and
    BatchNorm, so its training and eval modes compute differently."""

    def __init__(self, features: int = 6, classes: int = 3):
        super().__init__()
        self.linear = nn.Linear(features, 16)
        self.norm = nn.BatchNorm1d(16)
        self.dropout = nn.Dropout(0.3)
        self.head = nn.Linear(16, classes)

    def forward(self, x, **kwargs):
        return self.head(self.dropout(torch.relu(self.norm(self.linear(x)))))


class LayerDropNet(KeywordNet):
    """BART's LayerDrop: a random draw whose value only steers Python control flow (a trace drops it)."""

    def forward(self, x, **kwargs):
        hidden = self.linear(x)
        if self.training and torch.rand([]) < 0.0:  # layerdrop 0: never skips, still draws
            hidden = hidden.detach()
        return self.head(self.dropout(hidden))


class CumulativeNormNet(KeywordNet):
    """BatchNorm with ``momentum=None`` (a cumulative average: its factor 1 / num_batches_tracked is a
    Python float, which a trace freezes at its first value)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(16, momentum=None)


class IgnoredCallNet(nn.Module):
    """Scripts, but cannot be saved: forward calls a Python function TorchScript leaves to Python."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 3)

    @torch.jit.ignore
    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._scale(self.linear(x))


class _RoundStraightThrough(torch.autograd.Function):
    """Rounds forward, passes the gradient through unchanged (quantization-aware training's estimator)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class QuantizedNet(nn.Module):
    """A custom autograd.Function in forward: TorchScript can neither script nor trace it."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(_RoundStraightThrough.apply(self.linear(x) * 4) / 4)


def layer_drop() -> nn.Module:
    return LayerDropNet()


def export_regressor(folder):
    """A 3-8-1 regressor with Adam exported to ``folder / "m.pt"``, its data in ``folder / "train.npz"``:
    (path, x, y), for the tests of the torch range and its gate."""
    import numpy as np

    from gradbridge import export_training_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    x = np.random.default_rng(0).normal(size=(48, 3)).astype(np.float32)
    y = x.sum(1, keepdims=True).astype(np.float32)
    np.savez(folder / "train.npz", x=x, y=y)
    path = export_training_module(model, "mse", {"name": "adam", "lr": 0.01}, folder / "m.pt",
                                  example_inputs=(torch.from_numpy(x[:2]), torch.from_numpy(y[:2])))
    return path, x, y


class RowIndexNet(KeywordNet):
    """HF's decoder heads (GPT-2's on transformers 4.x) pick each row's last token with
    ``logits[torch.arange(batch_size), last]``, batch_size a Python int: a trace freezes it at the example's."""

    def forward(self, x, **kwargs):
        out = super().forward(x)
        return out[torch.arange(int(x.shape[0])), out.argmax(-1)].unsqueeze(1) * out


class TrainingRowIndexNet(RowIndexNet):
    """``RowIndexNet``'s frozen batch size in training mode alone: only the training trace holds it."""

    def forward(self, x, **kwargs):
        return super().forward(x) if self.training else KeywordNet.forward(self, x)
