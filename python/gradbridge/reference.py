"""The eager-PyTorch reference: the same training as the Java run, done with torch.optim.

``Reference`` is the eager twin of an exported training module: it starts from the module's own
initial tensors (read from the .pt by name) and trains with the real ``torch.optim`` optimizer
and ``torch.nn.functional`` loss named in the metadata, in torch.optim's order
``zero_grad; loss.backward(); step``. The model's forward is:

- the eager ``nn.Module`` you pass (the strongest check: no TorchScript on this side), or
- for the built-in ``linear-regression``, a fresh eager ``LinearRegression``, or
- otherwise the model stored in the .pt, run by the TorchScript interpreter (same aten ops,
  eager autograd; call it inside ``plain_graph_executor()``, which ``Reference`` does itself).
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import Tensor, nn

from . import protocol
from .export import losses, optim
from .history import EpochRecord, History
from .models import LinearRegression
from .torchscript import plain_graph_executor


def initial_state(model_path: str | os.PathLike) -> Dict[str, Tensor]:
    """The parameters and buffers stored in an exported module, by name."""
    module = torch.jit.load(str(model_path))
    names = module.parameter_names() + module.buffer_names()
    values = module.get_parameters() + module.get_buffers()
    return {name: value.detach().clone() for name, value in zip(names, values)}


def _as_numpy(tensors: Dict[str, Tensor]) -> Dict[str, np.ndarray]:
    return {name: t.detach().double().numpy().ravel().copy() for name, t in tensors.items()}


class Reference:
    """Eager torch.optim training of the model in ``model_path`` (see the module docstring)."""

    def __init__(self, model_path: str | os.PathLike, model: Optional[nn.Module] = None, *,
                 optimizer: Optional[Dict[str, Any]] = None):
        self.metadata = protocol.read_metadata(model_path)
        if model is None and self.metadata["model"] == "linear-regression":
            model = LinearRegression()
        if model is None:
            self.model: nn.Module = torch.jit.load(str(model_path)).model
        else:
            self.model = copy.deepcopy(model)
            state = initial_state(model_path)
            tensors = list(self.model.named_parameters()) + list(self.model.named_buffers())
            missing = sorted({name for name, _ in tensors} - set(state))
            if missing:
                raise ValueError(f"{model_path} has no values for {missing}: is it this model's export?")
            with torch.no_grad():
                for name, tensor in tensors:
                    tensor.copy_(state[name])
        self.model.train()
        self.loss = losses.build(self.metadata["loss"])
        self.optimizer = optim.torch_optimizer(optimizer or self.metadata["optimizer"], self.model.parameters())

    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        """One torch.optim step on (x, y); returns the loss (detached)."""
        with plain_graph_executor():
            self.optimizer.zero_grad()
            loss = self.loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()
        return loss.detach()

    def train_epoch(self, x: Tensor, y: Tensor, perm: Tensor, batch_size: int) -> List[Tensor]:
        """``train_step`` on ``index_select(0, perm[i:i + batch_size])`` batches, as ``train_epoch`` does."""
        return [self.train_step(x.index_select(0, perm[i:i + batch_size]), y.index_select(0, perm[i:i + batch_size]))
                for i in range(0, len(perm), batch_size)]

    def evaluate(self, x: Tensor, y: Tensor) -> Tensor:
        """The loss in eval mode without gradients; the model returns to training mode."""
        self.model.eval()
        try:
            with torch.no_grad(), plain_graph_executor():
                return self.loss(self.model(x), y)
        finally:
            self.model.train()

    def parameters(self) -> Dict[str, Tensor]:
        return {name: p.detach().clone() for name, p in self.model.named_parameters()}

    def buffers(self) -> Dict[str, Tensor]:
        return {name: b.detach().clone() for name, b in self.model.named_buffers()}

    def optimizer_state(self) -> Dict[str, List[Tensor]]:
        """torch.optim's per-parameter state as ``{key: [tensor per parameter]}`` (absent keys skipped)."""
        state: Dict[str, List[Tensor]] = {}
        params = list(self.model.parameters())
        for p in params:
            for key, value in self.optimizer.state[p].items():
                if torch.is_tensor(value):
                    state.setdefault(key, []).append(value.clone())
        return {key: values for key, values in state.items() if len(values) == len(params)}

    def snapshot(self) -> Dict[str, np.ndarray]:
        """Parameter values as float64 arrays (exact for float32), by name."""
        return _as_numpy(self.parameters())


def train_full_batch(
    model_path: str | os.PathLike, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float
) -> History:
    """The seed's training: full-batch SGD with ``lr`` on (x, y), recording every epoch.

    Same order as the Java seed driver: loss and gradients from the current parameters, then one
    ``torch.optim.SGD`` step; the record holds that loss and the stepped parameters.
    """
    reference = Reference(model_path, optimizer={"name": "sgd", "lr": lr})
    xs, ys = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
    history = History()
    for epoch in range(epochs):
        loss = reference.train_step(xs, ys)
        history.append(EpochRecord(epoch, float(loss.item()), reference.snapshot()))
    return history
