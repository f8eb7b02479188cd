"""The eager-PyTorch reference: the same training as the Java run, done with torch.optim.

The reference starts from the exported module's own initial tensors (read from the .pt by
name) and runs the textbook loop ``zero_grad; loss.backward(); step`` that the exported
methods reproduce op for op.
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import protocol
from .errors import ProtocolError
from .history import EpochRecord, History
from .models import BUILTIN_MODELS


def initial_parameters(model_path: str | os.PathLike) -> Dict[str, torch.Tensor]:
    """The parameters stored in an exported module, by name, in protocol order."""
    module = torch.jit.load(str(model_path))
    names = getattr(module, protocol.PARAMETER_NAMES)()
    values = getattr(module, protocol.GET_PARAMETERS)()
    return {name: value.detach().clone() for name, value in zip(names, values)}


def eager_model(model_path: str | os.PathLike) -> nn.Module:
    """A fresh eager instance of the exported built-in model, holding the .pt's initial tensors."""
    metadata = protocol.read_metadata(model_path)
    name = metadata["model"]
    if name not in BUILTIN_MODELS:
        raise ProtocolError(f"{model_path}: model {name!r} is not a built-in; known: {', '.join(BUILTIN_MODELS)}")
    model = BUILTIN_MODELS[name]()
    state = initial_parameters(model_path)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            param.copy_(state[param_name])
    return model


def snapshot(model: nn.Module) -> Dict[str, np.ndarray]:
    """Parameter values as float64 arrays (exact for float32), by name."""
    return {name: p.detach().double().numpy().ravel().copy() for name, p in model.named_parameters()}


def train_full_batch(
    model_path: str | os.PathLike, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float
) -> History:
    """Full-batch SGD on (x, y) for ``epochs`` epochs, recording every epoch.

    Same order as the Java seed driver: loss and gradients from the current parameters,
    then one ``torch.optim.SGD`` step; the record holds that loss and the stepped parameters.
    """
    metadata = protocol.read_metadata(model_path)
    reduction = metadata["loss"]["reduction"]
    model = eager_model(model_path)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    xs, ys = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
    history = History()
    for epoch in range(epochs):
        optimizer.zero_grad()
        loss = F.mse_loss(model(xs), ys, reduction=reduction)
        loss.backward()
        optimizer.step()
        history.append(EpochRecord(epoch, float(loss.item()), snapshot(model)))
    return history
