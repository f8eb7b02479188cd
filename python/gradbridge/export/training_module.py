"""Wrap a model, its loss and its optimizer into a scripted training module and save it.

The wrapper registers the model's own Parameter objects in an ``nn.ParameterList``: their
identity survives ``torch.jit.save``/``load``, so gradients and in-place updates reach the
model that ``forward`` runs.

Gradients live in explicit buffers (``grads``), computed with ``torch.autograd.grad`` and
accumulated by ``calculate_loss_and_backward``. This sidesteps the TorchScript trap in which
an unset ``.grad`` is an undefined tensor that an ``is not None`` test lets through, and it
gives the gradients a fixed order that matches ``parameter_names()``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .. import __version__, protocol
from ..models import BUILTIN_MODELS

log = logging.getLogger(__name__)

SUPPORTED_LOSSES = ("mse",)
SUPPORTED_OPTIMIZERS = ("sgd",)
_REDUCTIONS = ("mean", "sum")


class _TrainingModule(nn.Module):
    """The scripted protocol around ``model``; see ``gradbridge.protocol`` for the method list."""

    def __init__(self, model: nn.Module, reduction: str):
        super().__init__()
        named = list(model.named_parameters())
        self.model = model
        self.params = nn.ParameterList([p for _, p in named])
        self.names: List[str] = [name for name, _ in named]
        self.grads: List[torch.Tensor] = [torch.zeros_like(p, memory_format=torch.contiguous_format) for _, p in named]
        self.reduction = reduction

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    @torch.jit.export
    def calculate_loss_and_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward, loss and backward; gradients add to what is already accumulated."""
        loss = F.mse_loss(self.model(x), y, reduction=self.reduction)
        params: List[torch.Tensor] = [p for p in self.params]
        grads = torch.autograd.grad([loss], params, allow_unused=True)
        for i, grad in enumerate(grads):
            if grad is not None:
                self.grads[i].add_(grad)
        return loss.detach()

    @torch.jit.export
    def zero_grad(self) -> None:
        for grad in self.grads:
            grad.zero_()

    @torch.jit.export
    def sgd_step(self, lr: float) -> None:
        """Plain SGD, torch.optim.SGD's op (``p.add_(g, alpha=-lr)``); consumes the gradients."""
        with torch.no_grad():
            for i, p in enumerate(self.params):
                p.add_(self.grads[i], alpha=-lr)
        # Zeroing after the step keeps the seed's driver (backward, step, backward, ...) correct.
        self.zero_grad()

    @torch.jit.export
    def get_parameters(self) -> List[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    @torch.jit.export
    def parameter_names(self) -> List[str]:
        return self.names

    @torch.jit.export
    def get_gradients(self) -> List[torch.Tensor]:
        return [g.clone() for g in self.grads]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def export_training_module(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    inputs: Sequence[Dict],
    loss: str = "mse",
    reduction: str = "mean",
    optimizer: str = "sgd",
    lr: float = 0.01,
    model_name: str | None = None,
) -> Path:
    """Script ``model`` with the gradbridge protocol and save it atomically to ``path``.

    Args:
        model: the nn.Module to train; its parameters become the module's initial state.
        path: output ``.pt``; written to a temporary file first, then renamed, so an existing
            file is never left half-written.
        inputs: two tensor specs (``protocol.tensor_spec``): the input ``x`` and target ``y``.
        loss: one of ``SUPPORTED_LOSSES``. reduction: ``"mean"`` or ``"sum"``.
        optimizer: one of ``SUPPORTED_OPTIMIZERS``. lr: its learning rate (> 0).
        model_name: recorded in the metadata; defaults to the model's class name.

    Returns the path written. Raises ValueError for an unknown loss, optimizer or reduction, or
    a learning rate out of range, before anything is written.
    """
    if loss not in SUPPORTED_LOSSES:
        raise ValueError(f"Unknown loss {loss!r}; supported: {', '.join(SUPPORTED_LOSSES)}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"Invalid reduction {reduction!r}; expected one of {_REDUCTIONS}")
    if optimizer not in SUPPORTED_OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {optimizer!r}; supported: {', '.join(SUPPORTED_OPTIMIZERS)}")
    if not lr > 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if [spec["name"] for spec in inputs] != ["x", "y"]:
        raise ValueError(f"inputs must be the specs of 'x' and 'y', got {[s['name'] for s in inputs]}")

    scripted = torch.jit.script(_TrainingModule(model, reduction))
    metadata = protocol.build_metadata(
        model=model_name or type(model).__name__,
        parameters=[protocol.tensor_spec(n, p.shape, _dtype_name(p.dtype)) for n, p in model.named_parameters()],
        buffers=[protocol.tensor_spec(n, b.shape, _dtype_name(b.dtype)) for n, b in model.named_buffers()],
        loss={"name": loss, "reduction": reduction},
        optimizer={"name": optimizer, "lr": lr},
        inputs=list(inputs),
        torch_version=torch.__version__.split("+")[0],
        gradbridge_version=__version__,
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.jit.save(scripted, tmp, _extra_files={protocol.METADATA_FILE: json.dumps(metadata, indent=2)})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("wrote %s", path)
    return path


def export_builtin(name: str, path: str | os.PathLike, *, seed: int = 0, lr: float = 0.01) -> Path:
    """Export a model of ``models.BUILTIN_MODELS`` with initial parameters drawn under ``seed``."""
    if name not in BUILTIN_MODELS:
        raise ValueError(f"Unknown built-in model {name!r}; known: {', '.join(BUILTIN_MODELS)}")
    torch.manual_seed(seed)
    model = BUILTIN_MODELS[name]()
    inputs = [protocol.tensor_spec("x", [-1, 1], "float32"), protocol.tensor_spec("y", [-1, 1], "float32")]
    return export_training_module(model, path, inputs=inputs, lr=lr, model_name=name)
