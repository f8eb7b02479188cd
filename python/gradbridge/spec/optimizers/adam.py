"""torch.optim.Adam and AdamW as scripted optimizers (``base`` says what every one holds and runs)."""

from typing import Any, Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from ..scaling import scale_
from .base import ScriptedOptimizer, require, step_counters, zeros_like


class Adam(ScriptedOptimizer):
    """torch.optim.Adam (and AdamW with ``decoupled_weight_decay=True``). For each p with g::

        g = -g                                          if maximize
        step += 1
        p.mul_(1 - lr * weight_decay)                   if decoupled (AdamW) and weight_decay != 0
        g = g.add(p, alpha=weight_decay)                if not decoupled and weight_decay != 0
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        bias_correction1 = 1 - beta1 ** step            (Python floats, step read with .item())
        bias_correction2 = 1 - beta2 ** step
        step_size = lr / bias_correction1
        v = max_exp_avg_sq = maximum(max_exp_avg_sq, exp_avg_sq)   if amsgrad, else exp_avg_sq
        denom = (v.sqrt() / bias_correction2 ** 0.5).add_(eps)
        p.addcdiv_(exp_avg, denom, value=-step_size)

    Defaults: lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, maximize=False.
    State: step, exp_avg, exp_avg_sq, and max_exp_avg_sq with amsgrad (as torch.optim).
    """

    torch_name = "Adam"
    decoupled_default = False
    steps: List[Tensor]
    exp_avg: List[Tensor]
    exp_avg_sq: List[Tensor]
    max_exp_avg_sq: List[Tensor]

    def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, maximize: bool = False):
        super().__init__()
        require(lr >= 0.0, f"Invalid learning rate: {lr}")
        require(eps >= 0.0, f"Invalid epsilon value: {eps}")
        require(0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}")
        require(0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}")
        require(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        self.lr = float(lr)
        self.beta1 = float(betas[0])
        self.beta2 = float(betas[1])
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.amsgrad = bool(amsgrad)
        self.maximize = bool(maximize)
        self.decoupled_weight_decay = self.decoupled_default
        self.steps = step_counters(params)
        self.exp_avg = zeros_like(params)
        self.exp_avg_sq = zeros_like(params)
        self.max_exp_avg_sq = zeros_like(params) if self.amsgrad else []

    def hyperparameters(self) -> Dict[str, Any]:
        return {"lr": self.lr, "betas": [self.beta1, self.beta2], "eps": self.eps, "weight_decay": self.weight_decay,
                "amsgrad": self.amsgrad, "maximize": self.maximize}

    @torch.jit.export
    def step(self, params: List[Tensor], grads: List[Tensor], has_grad: List[bool]) -> None:
        for i in range(len(params)):
            if not has_grad[i]:
                continue
            param = params[i]
            grad = grads[i] if not self.maximize else -grads[i]
            exp_avg = self.exp_avg[i]
            exp_avg_sq = self.exp_avg_sq[i]
            step_t = self.steps[i]
            step_t.add_(1)
            if self.weight_decay != 0:
                if self.decoupled_weight_decay:
                    scale_(param, 1 - self.lr * self.weight_decay)
                else:
                    grad = grad.add(param, alpha=self.weight_decay)
            exp_avg.lerp_(grad, 1 - self.beta1)
            scale_(exp_avg_sq, self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            step = float(step_t.item())
            bias_correction1 = 1 - self.beta1 ** step
            bias_correction2 = 1 - self.beta2 ** step
            step_size = self.lr / bias_correction1
            bias_correction2_sqrt = bias_correction2 ** 0.5
            if self.amsgrad:
                max_exp_avg_sq = self.max_exp_avg_sq[i]
                torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
                denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            else:
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    @torch.jit.export
    def state(self) -> Dict[str, List[Tensor]]:
        state = {"step": self.steps, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}
        if self.amsgrad:
            state["max_exp_avg_sq"] = self.max_exp_avg_sq
        return state


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (``p.mul_(1 - lr * weight_decay)``).

    Defaults as Adam except weight_decay=1e-2.
    """

    torch_name = "AdamW"
    decoupled_default = True

    def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize)
