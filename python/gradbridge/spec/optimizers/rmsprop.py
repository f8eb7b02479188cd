"""torch.optim.RMSprop as a scripted optimizer (``base`` says what every one holds and runs)."""

from typing import Any, Dict, List, Sequence

import torch
from torch import Tensor

from ..scaling import scale_
from .base import ScriptedOptimizer, require, step_counters, zeros_like


class RMSprop(ScriptedOptimizer):
    """torch.optim.RMSprop. For each p with g::

        g = -g                                          if maximize
        step += 1
        g = g.add(p, alpha=weight_decay)                if weight_decay != 0
        square_avg.mul_(alpha).addcmul_(g, g, value=1 - alpha)
        if centered:
            grad_avg.lerp_(g, 1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            avg = square_avg.sqrt()
        avg = avg.add_(eps)
        if momentum > 0:
            buf.mul_(momentum).addcdiv_(g, avg); p.add_(buf, alpha=-lr)
        else:
            p.addcdiv_(g, avg, value=-lr)

    Defaults: lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False,
    maximize=False. State: step, square_avg, momentum_buffer with momentum > 0, grad_avg if
    centered (as torch.optim). A momentum set after construction (OneCycleLR) allocates
    momentum_buffer at the next step (zeros, as torch's first step of a parameter does).
    """

    torch_name = "RMSprop"
    steps: List[Tensor]
    square_avg: List[Tensor]
    momentum_buffer: List[Tensor]
    grad_avg: List[Tensor]

    def __init__(self, params: Sequence[Tensor], lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False, maximize: bool = False):
        super().__init__()
        require(lr >= 0.0, f"Invalid learning rate: {lr}")
        require(eps >= 0.0, f"Invalid epsilon value: {eps}")
        require(momentum >= 0.0, f"Invalid momentum value: {momentum}")
        require(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        require(alpha >= 0.0, f"Invalid alpha value: {alpha}")
        self.lr = float(lr)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.momentum = float(momentum)
        self.centered = bool(centered)
        self.maximize = bool(maximize)
        self.steps = step_counters(params)
        self.square_avg = zeros_like(params)
        self.momentum_buffer = zeros_like(params) if self.momentum > 0 else []
        self.grad_avg = zeros_like(params) if self.centered else []

    def hyperparameters(self) -> Dict[str, Any]:
        return {"lr": self.lr, "alpha": self.alpha, "eps": self.eps, "weight_decay": self.weight_decay,
                "momentum": self.momentum, "centered": self.centered, "maximize": self.maximize}

    @torch.jit.export
    def step(self, params: List[Tensor], grads: List[Tensor], has_grad: List[bool]) -> None:
        self.allocate(params)
        for i in range(len(params)):
            if not has_grad[i]:
                continue
            param = params[i]
            grad = grads[i] if not self.maximize else -grads[i]
            square_avg = self.square_avg[i]
            self.steps[i].add_(1)
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            scale_(square_avg, self.alpha).addcmul_(grad, grad, value=1 - self.alpha)
            if self.centered:
                grad_avg = self.grad_avg[i]
                grad_avg.lerp_(grad, 1 - self.alpha)
                avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
            else:
                avg = square_avg.sqrt()
            avg = avg.add_(self.eps)
            if self.momentum > 0:
                buf = self.momentum_buffer[i]
                scale_(buf, self.momentum).addcdiv_(grad, avg)
                param.add_(buf, alpha=-self.lr)
            else:
                param.addcdiv_(grad, avg, value=-self.lr)

    @torch.jit.export
    def state(self) -> Dict[str, List[Tensor]]:
        state = {"step": self.steps, "square_avg": self.square_avg}
        if len(self.momentum_buffer) > 0:
            state["momentum_buffer"] = self.momentum_buffer
        if self.centered:
            state["grad_avg"] = self.grad_avg
        return state

    @torch.jit.export
    def allocate(self, params: List[Tensor]) -> None:
        if self.momentum > 0 and len(self.momentum_buffer) == 0:
            self.momentum_buffer = zeros_like(params)
