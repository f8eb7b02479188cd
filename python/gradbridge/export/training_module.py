"""Wrap a model, its loss and its optimizer into a scripted training module and save it.

The wrapper registers the model's own Parameter objects in an ``nn.ParameterList`` (identity
survives ``torch.jit.save``/``load``, so gradients and in-place updates reach the tensors that
``forward`` uses), and the model's buffers in a list (they follow the model's in-place updates).

Gradients live in explicit buffers (``grads``) filled by ``torch.autograd.grad``, with a
``has_grad`` flag per parameter that plays the part of ``p.grad is None``. This sidesteps the
TorchScript trap in which an unset ``.grad`` is an undefined tensor that an ``is not None``
test lets through, and gives the gradients a fixed order, that of ``parameter_names()``.
"""


import contextlib
import copy
import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from .. import libtorch, ops, protocol, torchscript
from .._version import __version__
from ..errors import ExportError  # also importable from here, as before
from ..files import atomic_path
from ..models import BUILTIN_MODELS, SEED_LR
from . import finetune, groups as param_groups, losses, optim, schedulers

log = logging.getLogger(__name__)

SUPPORTED_LOSSES = tuple(losses.LOSSES)
SUPPORTED_OPTIMIZERS = tuple(optim.OPTIMIZERS)


class _TrainingModule(nn.Module):
    """The scripted protocol around ``model``; ``gradbridge.protocol`` lists the methods."""

    # Class-level annotations: TorchScript cannot infer the type of an empty list.
    names: List[str]
    grads: List[Tensor]
    has_grad: List[bool]
    buffer_list: List[Tensor]
    buffer_name_list: List[str]
    trainable_index: List[int]
    group_index: List[List[int]]

    def __init__(self, model: nn.Module, loss: nn.Module, optimizers: List[nn.Module],
                 parameter_names: List[str], parameters: List[nn.Parameter],
                 buffer_names: List[str], buffers: List[Tensor], *,
                 trainable_index: List[int], group_index: List[List[int]],
                 scheduler: nn.Module, scheduler_interval: str, lrs: List[float],
                 clip: Dict[str, Any], accumulate: int):
        super().__init__()
        self.model = model
        self.loss = loss
        # One scripted optimizer per parameter group (torch.optim steps groups independently).
        self.optimizers = nn.ModuleList(optimizers)
        self.params = nn.ParameterList(parameters)
        self.names = parameter_names
        self.grads = [torch.zeros_like(p, memory_format=torch.contiguous_format).detach() for p in parameters]
        self.has_grad = [False for _ in parameters]
        self.buffer_list = buffers
        self.buffer_name_list = buffer_names
        # Frozen parameters are not inputs of autograd.grad (it refuses tensors without grad).
        self.trainable_index = trainable_index
        self.group_index = group_index
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval  # "none", "step" or "epoch"
        self.clip_kind = str(clip.get("kind", "none"))  # "none", "norm" or "value"
        self.clip_max = float(clip.get("max", 0.0))
        self.clip_norm_type = float(clip.get("norm_type", 2.0))
        self.accumulate = int(accumulate)
        with torch.no_grad():
            self._set_lrs(lrs)
            self._set_momenta(scheduler.momenta())

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def _parameters_list(self) -> List[Tensor]:
        return [p for p in self.params]

    def _trainable_list(self) -> List[Tensor]:
        params = self._parameters_list()
        return [params[i] for i in self.trainable_index]

    @torch.jit.export
    def calculate_loss_and_backward(self, x: Tensor, y: Tensor) -> Tensor:
        """Forward, loss, backward; gradients add up as with ``loss.backward()``."""
        loss = self.loss(self.model(x), y)
        self._backward(loss)
        return loss.detach()

    def _backward(self, loss: Tensor) -> None:
        """Add d(loss)/d(p) to the gradient buffers of the trainable parameters."""
        grads = torch.autograd.grad([loss], self._trainable_list(), allow_unused=True)
        for k, grad in enumerate(grads):
            i = self.trainable_index[k]
            if grad is not None:
                if self.has_grad[i]:
                    self.grads[i].add_(grad)
                else:
                    self.grads[i].copy_(grad)
                    self.has_grad[i] = True

    @torch.jit.export
    def zero_grad(self) -> None:
        """Like ``optimizer.zero_grad()`` (set_to_none): no parameter has a gradient afterwards."""
        for i, grad in enumerate(self.grads):
            grad.zero_()
            self.has_grad[i] = False

    @torch.jit.export
    def optimizer_step(self) -> None:
        """Clip (if exported), one step of each group's optimizer, the per-step schedule (if any);
        consumes (zeroes) the gradients. torch's order: clip_grad_*_, optimizer.step(), scheduler.step()."""
        with torch.no_grad():
            self._clip()
            params = self._parameters_list()
            for g, opt in enumerate(self.optimizers):
                index = self.group_index[g]
                opt.step([params[i] for i in index], [self.grads[i] for i in index], [self.has_grad[i] for i in index])
            if self.scheduler_interval == "step":
                self._set_lrs(self.scheduler.step(self.get_lrs()))
                self._set_momenta(self.scheduler.momenta())
        self.zero_grad()

    def _set_momenta(self, momenta: List[float]) -> None:
        """OneCycleLR's cycled momentum: SGD/RMSprop ``momentum``, Adam/AdamW ``beta1`` (torch's betas[0])."""
        if len(momenta) == 0:
            return
        for g, opt in enumerate(self.optimizers):
            if hasattr(opt, "beta1"):
                opt.beta1 = momenta[g]
            elif hasattr(opt, "momentum"):
                opt.momentum = momenta[g]

    def _clip(self) -> None:
        """torch.nn.utils.clip_grad_norm_ / clip_grad_value_ on CPU: their foreach path (the default)."""
        if self.clip_kind == "none":
            return
        grads: List[Tensor] = []
        for i in range(len(self.grads)):
            if self.has_grad[i]:
                grads.append(self.grads[i])
        if len(grads) == 0:
            return
        # TorchScript runs the in-place _foreach_*_ ops on copies (measured: the grads stay as they
        # were), so the in-place steps go tensor by tensor: on CPU the foreach kernels are these
        # same element-wise ops one tensor at a time (the "slow" path), so the bits agree.
        if self.clip_kind == "value":
            for g in grads:
                g.clamp_min_(-self.clip_max).clamp_max_(self.clip_max)
            return
        norms = torch._foreach_norm(grads, self.clip_norm_type)
        total_norm = torch.linalg.vector_norm(torch.stack(norms), self.clip_norm_type)
        # eager `max_norm / (total_norm + 1e-6)` is Tensor.__rtruediv__: reciprocal() * max_norm
        clip_coef = (total_norm + 1e-6).reciprocal() * self.clip_max
        clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
        for g in grads:
            g.mul_(clip_coef_clamped)

    @torch.jit.export
    def schedule_epoch(self, metric: float) -> None:
        """The per-epoch schedule step, after an epoch: ReduceLROnPlateau gets ``metric`` (the
        validation loss, else the training loss); the others step; nothing for per-step schedules."""
        if self.scheduler_interval == "epoch":
            self._set_lrs(self.scheduler.step_metric(self.get_lrs(), metric))
            self._set_momenta(self.scheduler.momenta())

    @torch.jit.export
    def get_lrs(self) -> List[float]:
        """Each parameter group's learning rate, in group order."""
        lrs: List[float] = []
        for opt in self.optimizers:
            lrs.append(opt.lr)
        return lrs

    def _set_lrs(self, lrs: List[float]) -> None:
        for g, opt in enumerate(self.optimizers):
            opt.lr = lrs[g]

    @torch.jit.export
    def set_group_lr(self, group: int, lr: float) -> None:
        """Set one parameter group's learning rate."""
        if group < 0 or group >= len(self.group_index):
            raise RuntimeError("set_group_lr: no parameter group " + str(group) + "; there are "
                               + str(len(self.group_index)))
        if not lr >= 0.0:
            raise RuntimeError("set_group_lr: invalid learning rate " + str(lr))
        for g, opt in enumerate(self.optimizers):
            if g == group:
                opt.lr = lr

    @torch.jit.export
    def sgd_step(self, lr: float) -> None:
        """The seed's plain SGD, ``p.add_(g, alpha=-lr)`` (torch.optim.SGD's op); consumes the gradients."""
        with torch.no_grad():
            for i, p in enumerate(self.params):
                if self.has_grad[i]:
                    p.add_(self.grads[i], alpha=-lr)
        self.zero_grad()

    @torch.jit.export
    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        """zero_grad, loss and backward, optimizer step: torch.optim's order. Returns the loss.

        With gradient accumulation k > 1: the batch is split into micro-batches of
        ceil(n / k) rows (``x.split``), each adds the gradients of ``loss / k`` (the eager
        ``(loss / k).backward()`` loop), then one optimizer step; returns the sum of the
        ``loss / k`` values, in order.
        """
        self.zero_grad()
        if self.accumulate == 1:
            loss = self.calculate_loss_and_backward(x, y)
        else:
            size = (x.size(0) + self.accumulate - 1) // self.accumulate
            xs = x.split(size)
            ys = y.split(size)
            loss = torch.zeros([], dtype=x.dtype)
            for m in range(len(xs)):
                scaled = self.loss(self.model(xs[m]), ys[m]) / self.accumulate
                self._backward(scaled)
                if m == 0:
                    loss = scaled.detach()
                else:
                    loss = loss + scaled.detach()
        self.optimizer_step()
        return loss

    @torch.jit.export
    def train_epoch(self, x: Tensor, y: Tensor, perm: Tensor, batch_size: int) -> Tensor:
        """``train_step`` on ``x.index_select(0, perm[i:i + batch_size])`` for each batch; the losses."""
        if batch_size < 1:
            raise RuntimeError("train_epoch: batch_size must be at least 1, got " + str(batch_size))
        batch_losses: List[Tensor] = []
        for start in range(0, perm.size(0), batch_size):
            index = perm[start:start + batch_size]
            batch_losses.append(self.train_step(x.index_select(0, index), y.index_select(0, index)))
        return torch.stack(batch_losses)

    @torch.jit.export
    def evaluate(self, x: Tensor, y: Tensor) -> Tensor:
        """The loss without gradients, in the module's current mode (call eval() first to validate)."""
        with torch.no_grad():
            return self.loss(self.model(x), y)

    @torch.jit.export
    def parameter_names(self) -> List[str]:
        return self.names

    @torch.jit.export
    def get_parameters(self) -> List[Tensor]:
        return [p.detach().clone() for p in self.params]

    @torch.jit.export
    def get_gradients(self) -> List[Tensor]:
        return [g.clone() for g in self.grads]

    @torch.jit.export
    def gradient_flags(self) -> Tensor:
        """Which parameters hold a gradient (``p.grad is not None``), a bool tensor in
        ``parameter_names()`` order (protocol 2)."""
        return torch.tensor(self.has_grad, dtype=torch.bool)

    @torch.jit.export
    def set_gradients(self, values: List[Tensor], flags: Tensor) -> None:
        """Replace the gradient buffers with ``values`` (``parameter_names()`` order) and which of
        them hold a gradient with ``flags`` (bool); a following ``optimizer_step()`` steps with them,
        as ``p.grad = value`` (or ``None``) then ``optimizer.step()`` would (protocol 2)."""
        if len(values) != len(self.names) or flags.dim() != 1 or flags.size(0) != len(self.names):
            raise RuntimeError("set_gradients: expected " + str(len(self.names)) + " tensors and "
                               + str(len(self.names)) + " flags, got " + str(len(values)) + " and "
                               + str(flags.numel()))
        present: List[bool] = [bool(flags[i].item()) for i in range(len(self.names))]
        trainable = [False for _ in self.names]
        for i in self.trainable_index:
            trainable[i] = True
        for i, g in enumerate(self.grads):
            if values[i].shape != g.shape or values[i].dtype != g.dtype:
                raise RuntimeError("set_gradients: " + self.names[i] + " must have shape " + str(g.shape)
                                   + " and dtype " + str(g.dtype))
            if present[i] and not trainable[i]:
                raise RuntimeError("set_gradients: " + self.names[i] + " is frozen and cannot hold a gradient")
        with torch.no_grad():
            for i, g in enumerate(self.grads):
                if present[i]:
                    g.copy_(values[i])
                    self.has_grad[i] = True
                else:
                    g.zero_()
                    self.has_grad[i] = False

    @torch.jit.export
    def set_parameters(self, values: List[Tensor]) -> None:
        if len(values) != len(self.names):
            raise RuntimeError("set_parameters: expected " + str(len(self.names)) + " tensors, got " + str(len(values)))
        for i, p in enumerate(self.params):
            if values[i].shape != p.shape or values[i].dtype != p.dtype:
                raise RuntimeError("set_parameters: " + self.names[i] + " must have shape " + str(p.shape)
                                   + " and dtype " + str(p.dtype))
        with torch.no_grad():
            for i, p in enumerate(self.params):
                p.copy_(values[i])

    @torch.jit.export
    def buffer_names(self) -> List[str]:
        return self.buffer_name_list

    @torch.jit.export
    def get_buffers(self) -> List[Tensor]:
        return [b.clone() for b in self.buffer_list]

    @torch.jit.export
    def get_lr(self) -> float:
        """The first parameter group's learning rate (``get_lrs()`` has every group's)."""
        return self.get_lrs()[0]

    @torch.jit.export
    def set_lr(self, lr: float) -> None:
        """Set every parameter group's learning rate."""
        if not lr >= 0.0:
            raise RuntimeError("set_lr: invalid learning rate " + str(lr))
        for opt in self.optimizers:
            opt.lr = lr

    @torch.jit.export
    def optimizer_state(self) -> Dict[str, List[Tensor]]:
        """The optimizer's per-parameter state, by torch.optim's key; copies."""
        state = self._optimizer_state()
        copied: Dict[str, List[Tensor]] = {}
        for key, values in state.items():
            copied[key] = [v.clone() for v in values]
        return copied

    def _optimizer_state(self) -> Dict[str, List[Tensor]]:
        """Every group's state lists, concatenated in group order (torch.optim's state_dict order)."""
        merged: Dict[str, List[Tensor]] = {}
        for opt in self.optimizers:
            for key, values in opt.state().items():
                if key not in merged:
                    merged[key] = []
                merged[key].extend(values)
        return merged

    @torch.jit.export
    def load_optimizer_state(self, state: Dict[str, List[Tensor]]) -> None:
        """Restore what ``optimizer_state()`` returned (keys, counts and shapes must match)."""
        own = self._optimizer_state()
        for key, values in own.items():
            if key not in state:
                raise RuntimeError("load_optimizer_state: missing key " + key)
            given = state[key]
            if len(given) != len(values):
                raise RuntimeError("load_optimizer_state: " + key + " has " + str(len(given)) + " tensors, expected "
                                   + str(len(values)))
            for i in range(len(values)):
                if given[i].shape != values[i].shape:
                    raise RuntimeError("load_optimizer_state: " + key + "[" + str(i) + "] has the wrong shape")
        with torch.no_grad():
            for key, values in own.items():
                for i in range(len(values)):
                    values[i].copy_(state[key][i])


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _spec_from_example(name: str, example: Tensor) -> Dict[str, Any]:
    return protocol.tensor_spec(name, [-1, *example.shape[1:]], _dtype_name(example.dtype))


def _loss_spec(loss: Union[str, Dict[str, Any], nn.Module]) -> Dict[str, Any]:
    if isinstance(loss, str):
        return {"name": loss}
    if isinstance(loss, nn.Module):
        return losses.spec_of(loss)
    return dict(loss)


def _optimizer_spec(optimizer: Union[str, Dict[str, Any], torch.optim.Optimizer]) -> Dict[str, Any]:
    if isinstance(optimizer, str):
        return {"name": optimizer}
    if isinstance(optimizer, torch.optim.Optimizer):
        return optim.spec_of(optimizer)
    return dict(optimizer)


def _script_model(model: nn.Module, example_inputs: Optional[Tuple[Tensor, Tensor]]) -> nn.Module:
    """Script the model; if that fails, trace it on example_inputs, or say how to."""
    try:
        return torchscript.script(model)
    except Exception as ex:  # torch raises several types (NotSupportedError, RuntimeError, ...)
        reason = str(ex).strip()
        if example_inputs is None:
            raise ExportError(
                f"cannot script {type(model).__name__}: {reason}\n"
                "Hint: pass example_inputs=(x, y) to trace the model instead; "
                "tracing records one execution, so data-dependent control flow is frozen."
            ) from ex
        log.warning("scripting %s failed, tracing it on example_inputs instead: %s",
                    type(model).__name__, reason.splitlines()[0])
        return torchscript.trace(model, (example_inputs[0],))


def export_training_module(
    model: nn.Module,
    loss: Union[str, Dict[str, Any], nn.Module],
    optimizer: Union[str, Dict[str, Any], torch.optim.Optimizer],
    path: Union[str, os.PathLike],
    *,
    example_inputs: Optional[Tuple[Tensor, Tensor]] = None,
    inputs: Optional[Sequence[Dict[str, Any]]] = None,
    model_name: Optional[str] = None,
    freeze: Sequence[str] = (),
    scheduler: Any = None,
    scheduler_interval: str = "step",
    clip_grad_norm: Optional[float] = None,
    clip_norm_type: float = 2.0,
    clip_grad_value: Optional[float] = None,
    accumulate: int = 1,
    init_weights: Union[None, str, os.PathLike, Dict[str, Tensor]] = None,
) -> Path:
    """Script ``model`` with its loss and optimizer as a gradbridge training module at ``path``.

    Args:
        model: the nn.Module to train; its current parameters are the initial state. It is not
            modified: the exported module holds a deep copy.
        loss: a name of ``SUPPORTED_LOSSES``, a spec ``{"name": "cross_entropy",
            "label_smoothing": 0.1, ...}``, or a torch.nn loss module (``nn.CrossEntropyLoss(...)``).
        optimizer: a name of ``SUPPORTED_OPTIMIZERS``, a spec ``{"name": "adam", "lr": 1e-3, ...}``,
            or a fresh torch.optim optimizer over ``model.parameters()`` (one group, no state).
        path: output ``.pt``; written to a temporary file, then renamed: an existing file is never
            left half-written.
        example_inputs: one batch ``(x, y)``. Gives the input specs, is run once through the
            model and loss to check them, and is used to trace the model when it cannot be scripted.
        inputs: the specs of ``x`` and ``y`` (``protocol.tensor_spec``) when no example is given.
        model_name: recorded in the metadata; defaults to the model's class name.
        freeze: parameter-name prefixes to freeze (``requires_grad=False``) in the export, as
            well as any parameter already frozen in ``model``. Frozen parameters are exported but
            have no gradient, no optimizer state and never change.
        scheduler: a fresh ``torch.optim.lr_scheduler`` instance over ``optimizer`` (see
            ``schedulers.SUPPORTED``) or a spec ``{"name": "cosine", "T_max": 100}``.
        scheduler_interval: ``"step"`` (after every optimizer step) or ``"epoch"`` (at each epoch's
            end; ReduceLROnPlateau is always per epoch).
        clip_grad_norm, clip_norm_type: ``clip_grad_norm_(params, max_norm, norm_type)`` before
            every step (norm types 2 and inf); clip_grad_value: ``clip_grad_value_`` instead.
        accumulate: gradient accumulation, k micro-batches per optimizer step (see ``train_step``).
        init_weights: a ``state_dict`` (or a file saved with ``torch.save``, read with
            ``weights_only=True``) loaded into the copy of the model before export.

    Returns the path written.

    Raises:
        ValueError: unknown loss or optimizer, a hyper-parameter out of range, a target dtype that
            does not fit the loss, or missing input specs; raised before anything is written.
        ExportError: the model cannot be scripted and no example_inputs were given to trace it.
    """
    loss_spec = _loss_spec(loss)
    loss_module = losses.build(loss_spec)
    loss_spec = {"name": loss_spec["name"], **loss_module.options()}

    if example_inputs is not None:
        if len(example_inputs) != 2:
            raise ValueError(f"example_inputs must be (x, y), got {len(example_inputs)} tensors")
        specs = [_spec_from_example("x", example_inputs[0]), _spec_from_example("y", example_inputs[1])]
    elif inputs is not None:
        specs = [dict(spec) for spec in inputs]
    else:
        raise ValueError("pass example_inputs=(x, y) or inputs=[tensor_spec('x', ...), tensor_spec('y', ...)]")
    if [spec["name"] for spec in specs] != ["x", "y"]:
        raise ValueError(f"inputs must be the specs of 'x' and 'y', got {[s['name'] for s in specs]}")
    target_dtype = specs[1]["dtype"]
    if target_dtype not in loss_module.target_dtypes:
        raise ValueError(f"loss {loss_spec['name']} needs a target of dtype {' or '.join(loss_module.target_dtypes)}, "
                         f"got {target_dtype}")

    names_by_id = {id(p): n for n, p in model.named_parameters()}
    model = copy.deepcopy(model)
    named_parameters = list(model.named_parameters())
    parameters = [p for _, p in named_parameters]
    names = [n for n, _ in named_parameters]
    finetune.freeze(named_parameters, freeze)
    trainable = [p.requires_grad for p in parameters]
    if isinstance(optimizer, torch.optim.Optimizer):
        if scheduler is not None and not isinstance(scheduler, dict):
            if getattr(scheduler, "optimizer", optimizer) is not optimizer:
                raise ExportError(f"scheduler {type(scheduler).__name__} schedules another optimizer than the one "
                                  "exported; build it over that optimizer")
            schedulers.check_tensors(scheduler)
        # A scheduler's construction already moved the lrs; the spec holds the base lrs.
        with finetune.initial_lrs(optimizer) if scheduler is not None else contextlib.nullcontext():
            optimizer_spec = param_groups.spec_of_instance(optimizer, names_by_id, dict(zip(names, trainable)))
    else:
        optimizer_spec = _optimizer_spec(optimizer)
    resolved = param_groups.resolve(optimizer_spec, names, trainable)
    if not any(trainable):
        raise ValueError("every parameter is frozen: nothing to train")
    group_modules = [optim.build({"name": optimizer_spec["name"], **options}, [parameters[i] for i in indices])
                     for indices, options in resolved]
    hyper = [m.hyperparameters() for m in group_modules]
    optimizer_spec = param_groups.metadata_spec(optimizer_spec["name"], resolved, names, hyper)
    plan = finetune.plan(optimizer_spec, hyper, scheduler, scheduler_interval, clip_grad_norm, clip_norm_type,
                         clip_grad_value, accumulate)
    if init_weights is not None:
        finetune.load_weights(model, init_weights)

    if example_inputs is not None:
        # The check must not move BatchNorm statistics: the export holds the model's (or the
        # init weights') buffers exactly.
        saved_buffers = [(b, b.clone()) for b in model.buffers()]
        try:
            with torch.no_grad():
                loss_module(model(example_inputs[0]), example_inputs[1])
        except Exception as ex:
            raise ValueError(f"example_inputs do not fit the model and loss {loss_spec['name']}: {ex}") from ex
        finally:
            with torch.no_grad():
                for buffer, value in saved_buffers:
                    buffer.copy_(value)
    else:
        _check_specs_fit(model, loss_module, loss_spec["name"], specs, model_name or type(model).__name__)

    scripted_model = _script_model(model, example_inputs)
    # Tracing copies the module structure but keeps the Parameter objects; take names from the copy.
    named_buffers = list(scripted_model.named_buffers())
    wrapper = _TrainingModule(
        scripted_model, loss_module, group_modules,
        [name for name, _ in named_parameters], parameters,
        [name for name, _ in named_buffers], [b for _, b in named_buffers],
        trainable_index=[i for i, t in enumerate(trainable) if t],
        group_index=[indices for indices, _ in resolved],
        scheduler=plan.scheduler_module, scheduler_interval=plan.interval, lrs=plan.lrs,
        clip=plan.clip, accumulate=plan.accumulate,
    )
    scripted = torchscript.script(wrapper)
    metadata = protocol.build_metadata(
        model=model_name or type(model).__name__,
        parameters=[{**protocol.tensor_spec(n, p.shape, _dtype_name(p.dtype)), "trainable": p.requires_grad}
                    for n, p in named_parameters],
        buffers=[protocol.tensor_spec(n, b.shape, _dtype_name(b.dtype)) for n, b in named_buffers],
        loss=loss_spec,
        optimizer=optimizer_spec,
        inputs=specs,
        torch_version=libtorch.torch_version(),
        gradbridge_version=__version__,
        custom_ops=ops.used_by(scripted),
    )
    if plan.metadata:
        metadata[finetune.METADATA_KEY] = plan.metadata
    return _save_atomically(scripted, metadata, Path(path))


def _check_specs_fit(model: nn.Module, loss_module: nn.Module, loss_name: str, specs: Sequence[Dict[str, Any]],
                     name: str) -> None:
    """Run a zero batch of the declared shapes through a throwaway copy (eval mode, no grad), so
    a module that could never take a step is refused at export, not on its first step."""
    batch = [torch.zeros([2 if d == -1 else d for d in spec["shape"]], dtype=getattr(torch, spec["dtype"]))
             for spec in specs]
    try:
        with torch.no_grad():
            loss_module(copy.deepcopy(model).eval()(batch[0]), batch[1])
    except Exception as ex:  # torch raises RuntimeError, IndexError, ValueError...
        reason = " ".join(str(ex).split())
        raise ValueError(f"inputs x {specs[0]['shape']} {specs[0]['dtype']}, y {specs[1]['shape']} {specs[1]['dtype']} "
                         f"do not fit model {name} with loss {loss_name}: {reason}") from ex


def _save_atomically(scripted: torch.jit.ScriptModule, metadata: Dict[str, Any], path: Path) -> Path:
    with atomic_path(path) as tmp:
        torchscript.save(scripted, str(tmp), _extra_files={protocol.METADATA_FILE: json.dumps(metadata, indent=2)})
    log.info("wrote %s", path)
    return path


#: Built-in models' default loss and input specs, for `gradbridge export NAME`.
BUILTIN_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "linear-regression": {"loss": "mse", "x": ([-1, 1], "float32"), "y": ([-1, 1], "float32")},
}


def export_builtin(name: str, path: Union[str, os.PathLike], *, seed: int = 0, lr: float = SEED_LR,
                   optimizer: Optional[Dict[str, Any]] = None, loss: Optional[Dict[str, Any]] = None,
                   inputs: Optional[Sequence[Dict[str, Any]]] = None, fine_tuning: Optional[Dict[str, Any]] = None,
                   **model_options: Any) -> Path:
    """Export a model of ``models.BUILTIN_MODELS`` with initial parameters drawn under ``seed``.

    The linear regression defaults to MSE, SGD with ``lr`` and x, y of shape [-1, 1]; other
    built-ins need ``loss`` and ``inputs``. ``optimizer`` defaults to ``{"name": "sgd", "lr": lr}``.
    ``fine_tuning``: keyword arguments of ``export_training_module`` (freeze, scheduler, ...).
    """
    if name not in BUILTIN_MODELS:
        raise ValueError(f"Unknown built-in model {name!r}; known: {', '.join(BUILTIN_MODELS)}")
    defaults = BUILTIN_DEFAULTS.get(name, {})
    if inputs is None and defaults:
        inputs = [protocol.tensor_spec("x", *defaults["x"]), protocol.tensor_spec("y", *defaults["y"])]
    loss = loss or ({"name": defaults["loss"]} if defaults else None)
    if loss is None or inputs is None:
        raise ValueError(f"built-in model {name!r} needs a loss and input specs")
    optimizer = optimizer or {"name": "sgd", "lr": lr}
    # Validate before drawing parameters so bad options never touch torch's RNG or the file.
    losses.build(loss)
    optim.build({k: v for k, v in optimizer.items() if k != "groups"}, [])
    torch.manual_seed(seed)
    model = BUILTIN_MODELS[name](**model_options)
    return export_training_module(model, loss, optimizer, path, inputs=inputs, model_name=name, **(fine_tuning or {}))
