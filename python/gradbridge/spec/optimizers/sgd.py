"""torch.optim.SGD as a scripted optimizer (``base`` says what every one holds and runs)."""

from typing import Any, Dict, List, Sequence

import torch
from torch import Tensor

from ..scaling import scale_
from .base import ScriptedOptimizer, require, zeros_like


class SGD(ScriptedOptimizer):
    """torch.optim.SGD. For each parameter p with gradient g::

        g = -g                                   if maximize
        g = g.add(p, alpha=weight_decay)         if weight_decay != 0
        if momentum != 0:
            b = clone(g)                         on the parameter's first step
            b.mul_(momentum).add_(g, alpha=1 - dampening)   afterwards
            g = g.add(b, alpha=momentum) if nesterov else b
        p.add_(g, alpha=-lr)

    Defaults: lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, maximize=False.
    State: momentum_buffer while momentum != 0 (none without momentum), as torch.optim. Allocated
    with the optimizer, or at the first step with momentum (OneCycleLR can set it later);
    ``has_buffer[i]`` (not state) stands for torch's ``momentum_buffer is not None``: set by the
    parameter's first step with momentum, and by a load of a state that holds a buffer for it; a state
    without one for a parameter (torch's before its first step) leaves it unset, so that step copies
    the gradient, as torch's does.
    """

    torch_name = "SGD"
    momentum_buffer: List[Tensor]
    has_buffer: List[bool]

    def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False):
        super().__init__()
        require(lr >= 0.0, f"Invalid learning rate: {lr}")
        require(momentum >= 0.0, f"Invalid momentum value: {momentum}")
        require(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        require(not nesterov or (momentum > 0 and dampening == 0), "Nesterov momentum requires a momentum and zero dampening")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.dampening = float(dampening)
        self.weight_decay = float(weight_decay)
        self.nesterov = bool(nesterov)
        self.maximize = bool(maximize)
        self.momentum_buffer = zeros_like(params) if self.momentum != 0 else []
        self.has_buffer = [False for _ in params]

    def hyperparameters(self) -> Dict[str, Any]:
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov, "maximize": self.maximize}

    @torch.jit.export
    def step(self, params: List[Tensor], grads: List[Tensor], has_grad: List[bool]) -> None:
        self.allocate(params)
        for i in range(len(params)):
            if not has_grad[i]:
                continue
            param = params[i]
            grad = grads[i] if not self.maximize else -grads[i]
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            if self.momentum != 0:
                buf = self.momentum_buffer[i]
                if not self.has_buffer[i]:
                    buf.copy_(grad)
                    self.has_buffer[i] = True
                else:
                    scale_(buf, self.momentum).add_(grad, alpha=1 - self.dampening)
                if self.nesterov:
                    grad = grad.add(buf, alpha=self.momentum)
                else:
                    grad = buf
            param.add_(grad, alpha=-self.lr)

    @torch.jit.export
    def state(self) -> Dict[str, List[Tensor]]:
        state: Dict[str, List[Tensor]] = {}
        if len(self.momentum_buffer) > 0:
            state["momentum_buffer"] = self.momentum_buffer
        return state

    @torch.jit.export
    def allocate(self, params: List[Tensor]) -> None:
        if self.momentum != 0 and len(self.momentum_buffer) == 0:
            self.momentum_buffer = zeros_like(params)

    @torch.jit.export
    def held(self) -> Dict[str, List[bool]]:
        held: Dict[str, List[bool]] = {}
        if len(self.momentum_buffer) > 0:
            held["momentum_buffer"] = self.has_buffer
        return held

    @torch.jit.export
    def loaded(self, held: Dict[str, List[bool]]) -> None:
        if len(self.momentum_buffer) > 0:
            self.has_buffer = list(held["momentum_buffer"])
