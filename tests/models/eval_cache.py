"""A model that keeps state across eval-mode calls, as timm's LeViT does (its attention biases cached in eval
mode, the cache cleared by its Python ``train()``). No ``from __future__ import annotations`` here:
TorchScript reads the class-level attribute annotation as a type."""

from typing import Dict

import torch
from torch import Tensor, nn


class EvalCacheNet(nn.Module):
    """A value cached in eval mode, the cache cleared by the model's Python train()."""

    cache: Dict[str, Tensor]

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.bias = nn.Parameter(torch.zeros(3))
        self.cache = {}

    def train(self, mode: bool = True):
        super().train(mode)
        if mode and self.cache:
            self.cache = {}
        return self

    def forward(self, x):
        if self.training:
            b = self.bias * 2
        else:
            if "b" not in self.cache:
                self.cache["b"] = self.bias * 2
            b = self.cache["b"]
        return self.lin(x) + b
