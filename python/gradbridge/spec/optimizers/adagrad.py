"""torch.optim.Adagrad (dense gradients) as a scripted optimizer (``base`` says what every one holds and runs)."""

from typing import Any, Dict, List, Sequence

import torch
from torch import Tensor

from .base import ScriptedOptimizer, require, step_counters


class Adagrad(ScriptedOptimizer):
    """torch.optim.Adagrad (dense gradients). For each p with g::

        step += 1
        g = -g                                          if maximize
        g = g.add(p, alpha=weight_decay)                if weight_decay != 0
        clr = lr / (1 + (step - 1) * lr_decay)
        sum.addcmul_(g, g, value=1)
        std = sum.sqrt().add_(eps)
        p.addcdiv_(g, std, value=-clr)

    Defaults: lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
    maximize=False. State: step, sum (starts at initial_accumulator_value).
    """

    torch_name = "Adagrad"
    steps: List[Tensor]
    sum: List[Tensor]

    def __init__(self, params: Sequence[Tensor], lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, maximize: bool = False):
        super().__init__()
        require(lr >= 0.0, f"Invalid learning rate: {lr}")
        require(lr_decay >= 0.0, f"Invalid lr_decay value: {lr_decay}")
        require(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        require(initial_accumulator_value >= 0.0, f"Invalid initial_accumulator_value value: {initial_accumulator_value}")
        require(eps >= 0.0, f"Invalid epsilon value: {eps}")
        self.lr = float(lr)
        self.lr_decay = float(lr_decay)
        self.weight_decay = float(weight_decay)
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.eps = float(eps)
        self.maximize = bool(maximize)
        self.steps = step_counters(params)
        self.sum = [torch.full_like(p, self.initial_accumulator_value,
                                                  memory_format=torch.preserve_format).detach() for p in params]

    def hyperparameters(self) -> Dict[str, Any]:
        return {"lr": self.lr, "lr_decay": self.lr_decay, "weight_decay": self.weight_decay,
                "initial_accumulator_value": self.initial_accumulator_value, "eps": self.eps,
                "maximize": self.maximize}

    @torch.jit.export
    def step(self, params: List[Tensor], grads: List[Tensor], has_grad: List[bool]) -> None:
        for i in range(len(params)):
            if not has_grad[i]:
                continue
            param = params[i]
            step_t = self.steps[i]
            step_t.add_(1)
            step = float(step_t.item())
            grad = grads[i] if not self.maximize else -grads[i]
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            clr = self.lr / (1 + (step - 1) * self.lr_decay)
            state_sum = self.sum[i]
            state_sum.addcmul_(grad, grad, value=1)
            std = state_sum.sqrt().add_(self.eps)
            param.addcdiv_(grad, std, value=-clr)

    @torch.jit.export
    def state(self) -> Dict[str, List[Tensor]]:
        return {"step": self.steps, "sum": self.sum}
