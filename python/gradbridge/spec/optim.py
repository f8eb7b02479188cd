"""Optimizers as TorchScript modules, op for op the single-tensor paths of torch.optim 2.7.1.

Each class holds its hyper-parameters and per-parameter state: the keys torch.optim's
``optimizer.state[p]`` holds after a step with the same hyper-parameters, no others (SGD without
momentum has none; Adam's ``max_exp_avg_sq`` only with amsgrad; RMSprop's ``momentum_buffer`` only
with momentum, ``grad_avg`` only centered), so a saved module is its parameters, their gradient
buffers and torch's own state. Each has these scripted methods::

    step(params, grads, has_grad)   # under torch.no_grad(); skips parameters without a gradient
    state()                         # {key: [tensor per parameter]}, the live tensors
    allocate(params)                # create the state a momentum set after construction calls for
    held()                          # which parameters hold a key torch.optim creates at their first step
    loaded(held)                    # load_optimizer_state copied a state in, holding those keys so

``has_grad[i]`` is False where torch.optim would see ``p.grad is None`` (the parameter took no
part in the loss since the last ``zero_grad``): such a parameter and its state stay untouched,
as in torch.optim. The docstrings state the update each class performs; the parity tests in
``tests/test_optim.py`` hold them to torch.optim bit for bit.

On CPU, torch.optim defaults to these single-tensor paths (foreach and fused are off for CPU
tensors), so this is the arithmetic a Python user's training actually runs.
"""


from typing import Any, Dict, List, Sequence, Tuple

import torch
from torch import Tensor, nn

from .. import protocol
from ..errors import GradbridgeError
from .options import check, tensor_refused
from .scaling import scale_


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _zeros_like(params: List[Tensor]) -> List[Tensor]:
    return [torch.zeros_like(p, memory_format=torch.preserve_format).detach() for p in params]


def _steps(params: Sequence[Tensor]) -> List[Tensor]:
    # torch.optim keeps `step` as a float32 scalar tensor and reads it with .item().
    return [torch.tensor(0.0, dtype=torch.float32) for _ in params]


class _Optimizer(nn.Module):
    """Hooks for state that depends on a hyper-parameter a schedule can change (OneCycleLR's
    momentum): no-ops here; SGD and RMSprop override them."""

    @torch.jit.export
    def allocate(self, params: List[Tensor]) -> None:
        """Create the state lists the hyper-parameters as they are now call for, if missing (a
        schedule set them after construction); ``step`` and ``load_optimizer_state`` call it first."""
        pass

    @torch.jit.export
    def held(self) -> Dict[str, List[bool]]:
        """For each key of ``state()`` that torch.optim creates at a parameter's first step and whose
        absence changes that step (SGD's momentum_buffer: a copy of the gradient, not an update), which
        parameters hold it now; every parameter holds the keys not listed (their tensors start as torch's
        first step makes them)."""
        none: Dict[str, List[bool]] = {}
        return none

    @torch.jit.export
    def loaded(self, held: Dict[str, List[bool]]) -> None:
        """After ``load_optimizer_state`` copied a state in; ``held``: for each key of ``held()``, which
        parameters that state holds it for."""
        pass


class SGD(_Optimizer):
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
        _check(lr >= 0.0, f"Invalid learning rate: {lr}")
        _check(momentum >= 0.0, f"Invalid momentum value: {momentum}")
        _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        _check(not nesterov or (momentum > 0 and dampening == 0), "Nesterov momentum requires a momentum and zero dampening")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.dampening = float(dampening)
        self.weight_decay = float(weight_decay)
        self.nesterov = bool(nesterov)
        self.maximize = bool(maximize)
        self.momentum_buffer = _zeros_like(params) if self.momentum != 0 else []
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
            self.momentum_buffer = _zeros_like(params)

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


class Adam(_Optimizer):
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
        _check(lr >= 0.0, f"Invalid learning rate: {lr}")
        _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
        _check(0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}")
        _check(0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}")
        _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        self.lr = float(lr)
        self.beta1 = float(betas[0])
        self.beta2 = float(betas[1])
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.amsgrad = bool(amsgrad)
        self.maximize = bool(maximize)
        self.decoupled_weight_decay = self.decoupled_default
        self.steps = _steps(params)
        self.exp_avg = _zeros_like(params)
        self.exp_avg_sq = _zeros_like(params)
        self.max_exp_avg_sq = _zeros_like(params) if self.amsgrad else []

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


class RMSprop(_Optimizer):
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
        _check(lr >= 0.0, f"Invalid learning rate: {lr}")
        _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
        _check(momentum >= 0.0, f"Invalid momentum value: {momentum}")
        _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        _check(alpha >= 0.0, f"Invalid alpha value: {alpha}")
        self.lr = float(lr)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.momentum = float(momentum)
        self.centered = bool(centered)
        self.maximize = bool(maximize)
        self.steps = _steps(params)
        self.square_avg = _zeros_like(params)
        self.momentum_buffer = _zeros_like(params) if self.momentum > 0 else []
        self.grad_avg = _zeros_like(params) if self.centered else []

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
            self.momentum_buffer = _zeros_like(params)


class Adagrad(_Optimizer):
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
        _check(lr >= 0.0, f"Invalid learning rate: {lr}")
        _check(lr_decay >= 0.0, f"Invalid lr_decay value: {lr_decay}")
        _check(weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}")
        _check(initial_accumulator_value >= 0.0, f"Invalid initial_accumulator_value value: {initial_accumulator_value}")
        _check(eps >= 0.0, f"Invalid epsilon value: {eps}")
        self.lr = float(lr)
        self.lr_decay = float(lr_decay)
        self.weight_decay = float(weight_decay)
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.eps = float(eps)
        self.maximize = bool(maximize)
        self.steps = _steps(params)
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


#: name used by the CLI and the metadata -> class
OPTIMIZERS: Dict[str, type] = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop, "adagrad": Adagrad}


def build(spec: Dict[str, Any], params: Sequence[Tensor]) -> nn.Module:
    """The scripted-optimizer module for a spec ``{"name": ..., hyper-parameters...}``."""
    options = dict(spec)
    name = options.pop("name", None)
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; supported: {', '.join(OPTIMIZERS)}")
    cls = OPTIMIZERS[name]
    check_options(name, options, f"optimizer {name}")
    if "betas" in options:
        options["betas"] = tuple(options["betas"])
    return cls(params, **options)


#: torch.optim settings that choose another implementation than the single-tensor path this
#: module reproduces: exported only at these values (their defaults).
_IMPLEMENTATION_SETTINGS = {"foreach": (None, False), "fused": (None, False), "capturable": (False,),
                            "differentiable": (False,)}


def check_torch_group(torch_name: str, group: Dict[str, Any], where: str) -> None:
    """Refuse (one line) a torch.optim group whose settings pick arithmetic the export does not
    hold: foreach/fused/capturable/differentiable, or Adam's decoupled weight decay (AdamW's)."""
    for key, allowed in _IMPLEMENTATION_SETTINGS.items():
        if key in group and group[key] not in allowed:
            raise GradbridgeError(f"{where}: {key}={group[key]!r} is not exported: gradbridge reproduces "
                                  f"torch.optim's single-tensor path (the CPU default); leave {key} unset")
    decoupled = group.get("decoupled_weight_decay")
    if decoupled is not None and bool(decoupled) != (torch_name == "AdamW"):
        other = "torch.optim.AdamW" if decoupled else "torch.optim.Adam"
        raise GradbridgeError(f"{where}: decoupled_weight_decay={decoupled!r} is not exported: use {other}")


def check_options(name: str, options: Dict[str, Any], where: str) -> None:
    """Each option is one optimizer ``name`` takes, of its default's type (``options.check``)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {name!r}; supported: {', '.join(OPTIMIZERS)}")
    check(where, OPTIMIZERS[name], options)


def _has_stepped(optimizer: torch.optim.Optimizer) -> bool:
    """Whether any parameter's state shows a step. Adagrad creates its state (step 0, sum) when
    it is constructed, so state alone does not mean a step; a state without ``step`` (SGD's
    momentum buffer) appears only with the first step."""
    for state in optimizer.state.values():
        if "step" in state:
            if float(state["step"]) > 0:
                return True
        elif state:
            return True
    return False


def spec_of(optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """The spec of a fresh torch.optim optimizer (one parameter group, no state yet)."""
    by_torch_name = {cls.torch_name: name for name, cls in OPTIMIZERS.items()}
    torch_name = type(optimizer).__name__
    if torch_name not in by_torch_name:
        raise ValueError(f"Unknown optimizer {torch_name}; supported: {', '.join(by_torch_name)}")
    if len(optimizer.param_groups) != 1:
        raise GradbridgeError(f"{torch_name} has {len(optimizer.param_groups)} parameter groups; gradbridge exports one")
    if _has_stepped(optimizer):
        raise GradbridgeError(f"{torch_name} has already stepped; export a fresh optimizer (state travels with "
                              "optimizer_state/load_optimizer_state)")
    name = by_torch_name[torch_name]
    group = optimizer.param_groups[0]
    check_torch_group(torch_name, group, torch_name)
    keys = OPTIMIZERS[name]([]).hyperparameters().keys()
    spec: Dict[str, Any] = {"name": name}
    for key in keys:
        value = group[key]
        if torch.is_tensor(value) or (isinstance(value, tuple) and any(torch.is_tensor(v) for v in value)):
            raise GradbridgeError(tensor_refused(torch_name, key, value))
        spec[key] = list(value) if isinstance(value, tuple) else value
    return spec


def torch_optimizer(spec: Dict[str, Any], params, single_tensor: bool = False) -> torch.optim.Optimizer:
    """The torch.optim optimizer that the spec's scripted optimizer reproduces (the reference).
    ``single_tensor``: torch.optim's single-tensor path, which it takes by default on the CPU only (CUDA
    parameters default to the foreach path; the scripted optimizers copy the single-tensor one)."""
    options = dict(spec)
    cls = OPTIMIZERS[options.pop("name")]
    if "betas" in options:
        options["betas"] = tuple(options["betas"])
    if single_tensor and options.get("foreach") is None:
        options["foreach"] = False
    return getattr(torch.optim, cls.torch_name)(params, **options)


def clip_of(metadata: Dict[str, Any]) -> Dict[str, Any]:
    """The clip entry of a module's metadata, with ``"inf"`` back as a float."""
    clip = dict(metadata.get(protocol.FINE_TUNING_KEY, {}).get("clip", {"kind": "none"}))
    if "norm_type" in clip:
        clip["norm_type"] = float(clip["norm_type"])
    return clip
