"""Fine-tuning options of an export: frozen parameters, schedule, clipping, accumulation, weights.

``plan`` checks the options and turns them into what the scripted module holds; the metadata
entry ``fine_tuning`` (only written when an option is set) records them for the Python
reference and for Java::

    "fine_tuning": {"scheduler": {"name": "cosine", "T_max": 100, "eta_min": 0.0},
                    "scheduler_interval": "step",
                    "clip": {"kind": "norm", "max": 1.0, "norm_type": 2.0},
                    "accumulate": 4}

Pretrained weights travel both ways: ``load_weights`` starts an export from a ``state_dict``
(read with ``torch.load(weights_only=True)``); ``export.weights`` turns an exported module or a Java
checkpoint back into one that ``model.load_state_dict`` takes (``state_dict_of`` and ``save_state_dict``,
also importable from here, as before).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from .. import protocol
from ..errors import ExportError, FineTuneError  # FineTuneError: also importable from here, as before
from ..spec import groups as param_groups, optim, scheduler_modules, schedulers
from ..spec.options import tensor_refused
from .weights import save_state_dict, state_dict_of  # noqa: F401  (their home before export.weights)

METADATA_KEY = protocol.FINE_TUNING_KEY


@dataclass
class Plan:
    scheduler_module: nn.Module
    interval: str
    lrs: List[float]
    clip: Dict[str, Any]
    accumulate: int
    metadata: Dict[str, Any] = field(default_factory=dict)


def freeze_prefixes(named_parameters: Sequence[Tuple[str, nn.Parameter]], prefixes: Sequence[str]) -> None:
    """requires_grad_(False) on every parameter whose name starts with one of ``prefixes``."""
    for prefix in prefixes:
        matched = [p for n, p in named_parameters if n.startswith(prefix)]
        if not matched:
            raise FineTuneError(f"freeze {prefix!r}: no parameter of the model starts with it")
        for p in matched:
            p.requires_grad_(False)


@contextlib.contextmanager
def initial_lrs(optimizer: torch.optim.Optimizer):
    """While a scheduler has moved the groups' lr (its initial step), show the base lrs: the spec
    must hold what a fresh optimizer starts from, so the reference can rebuild the pair."""
    saved = [g["lr"] for g in optimizer.param_groups]
    name = type(optimizer).__name__
    for index, lr in enumerate(saved):
        if torch.is_tensor(lr):  # still a tensor under the schedule, whatever the base lrs are
            where = name if len(saved) == 1 else f"{name} parameter group {index}"
            raise FineTuneError(tensor_refused(where, "lr", lr))
    try:
        for g in optimizer.param_groups:
            if "initial_lr" in g:
                g["lr"] = g["initial_lr"]
        yield optimizer
    finally:
        for g, lr in zip(optimizer.param_groups, saved):
            g["lr"] = lr


def _torch_optimizer_like(name: str, hyper: List[Dict[str, Any]]) -> torch.optim.Optimizer:
    """A torch optimizer over one dummy tensor per group with the groups' options: lets the real
    torch scheduler compute its starting state (initial lrs, first step)."""
    cls = getattr(torch.optim, optim.OPTIMIZERS[name].torch_name)
    groups = []
    for options in hyper:
        options = {k: (tuple(v) if k == "betas" else v) for k, v in options.items()}
        groups.append({"params": [torch.zeros(1, requires_grad=True)], **options})
    return cls(groups)


def plan(optimizer_spec: Dict[str, Any], hyper: List[Dict[str, Any]], scheduler: Any, interval: str,
         clip_grad_norm: Optional[float], clip_norm_type: float, clip_grad_value: Optional[float],
         accumulate: int) -> Plan:
    """Check the options; build the scripted schedule in a fresh torch scheduler's state."""
    metadata: Dict[str, Any] = {}
    if interval not in schedulers.INTERVALS:
        raise FineTuneError(f"scheduler_interval must be one of {schedulers.INTERVALS}, got {interval!r}")
    lrs = [float(h["lr"]) for h in hyper]
    if scheduler is None:
        module: nn.Module = scheduler_modules.NoSchedule(lrs)
        interval = "none"
    else:
        spec = dict(scheduler) if isinstance(scheduler, dict) else schedulers.spec_of(scheduler)
        schedulers.validate(spec, len(hyper))
        if spec["name"] == "plateau":
            interval = "epoch"  # it needs the epoch's loss
        torch_opt = _torch_optimizer_like(optimizer_spec["name"], hyper)
        try:
            schedulers.torch_scheduler(spec, torch_opt)
        except (TypeError, ValueError, KeyError) as ex:
            raise FineTuneError(f"scheduler {spec['name']}: {ex}") from ex
        module = schedulers.build(spec, torch_opt)
        if spec["name"] == "onecycle" and spec.get("cycle_momentum", True):
            # torch's construction already set each group's momentum (or beta1) to the cycle's start
            module.last_momenta = [float(g["betas"][0] if "betas" in g else g["momentum"])
                                   for g in torch_opt.param_groups]
        lrs = [float(g["lr"]) for g in torch_opt.param_groups]
        metadata["scheduler"] = spec
        metadata["scheduler_interval"] = interval
    clip: Dict[str, Any] = {"kind": "none"}
    if clip_grad_norm is not None and clip_grad_value is not None:
        raise FineTuneError("clip by norm or by value, not both")
    if clip_grad_norm is not None:
        norm_type = float(clip_norm_type)
        if not (clip_grad_norm >= 0 and math.isfinite(clip_grad_norm)):
            raise FineTuneError(f"clip_grad_norm must be a finite number >= 0, got {clip_grad_norm}")
        if not (norm_type > 0):
            raise FineTuneError(f"clip_norm_type must be positive or inf, got {clip_norm_type}")
        clip = {"kind": "norm", "max": float(clip_grad_norm), "norm_type": norm_type}
    elif clip_grad_value is not None:
        if not (clip_grad_value >= 0 and math.isfinite(clip_grad_value)):
            raise FineTuneError(f"clip_grad_value must be a finite number >= 0, got {clip_grad_value}")
        clip = {"kind": "value", "max": float(clip_grad_value)}
    if clip["kind"] != "none":
        metadata["clip"] = {k: (str(v) if isinstance(v, float) and math.isinf(v) else v) for k, v in clip.items()}
    if not (isinstance(accumulate, int) and accumulate >= 1):
        raise FineTuneError(f"accumulate must be an integer >= 1, got {accumulate!r}")
    if accumulate > 1:
        metadata["accumulate"] = accumulate
    return Plan(module, interval, lrs, clip, accumulate, metadata)


@dataclass
class Setup:
    """What both formats export of the optimizer and the fine-tuning options (``setup``)."""
    spec: Dict[str, Any]  # the metadata's optimizer entry
    resolved: List[Tuple[List[int], Dict[str, Any]]]  # groups.resolve: (parameter indices, options) per group
    optimizers: List[nn.Module]  # each group's scripted optimizer (``optim``)
    trainable: List[bool]
    plan: Plan


def setup(named_parameters: Sequence[Tuple[str, nn.Parameter]], names_by_id: Dict[int, str], optimizer: Any, *,
          freeze: Sequence[str], scheduler: Any, scheduler_interval: str, clip_grad_norm: Optional[float],
          clip_norm_type: float, clip_grad_value: Optional[float], accumulate: int) -> Setup:
    """Freeze, resolve the parameter groups and check every option (``export_training_module``'s
    arguments) over the copy of the model being exported; ``names_by_id`` names the user's parameters (what
    a torch.optim instance holds). Raises before anything is written."""
    freeze_prefixes(named_parameters, freeze)
    names = [n for n, _ in named_parameters]
    parameters = [p for _, p in named_parameters]
    trainable = [p.requires_grad for p in parameters]
    if isinstance(optimizer, torch.optim.Optimizer):
        if scheduler is not None and not isinstance(scheduler, dict):
            if getattr(scheduler, "optimizer", optimizer) is not optimizer:
                raise ExportError(f"scheduler {type(scheduler).__name__} schedules another optimizer than the one "
                                  "exported; build it over that optimizer")
            schedulers.check_tensors(scheduler)
        # A scheduler's construction already moved the lrs; the spec holds the base lrs.
        with initial_lrs(optimizer) if scheduler is not None else contextlib.nullcontext():
            spec = param_groups.spec_of_instance(optimizer, names_by_id, dict(zip(names, trainable)))
    else:
        spec = {"name": optimizer} if isinstance(optimizer, str) else dict(optimizer)
    resolved = param_groups.resolve(spec, names, trainable)
    if not any(trainable):
        raise ValueError("every parameter is frozen: nothing to train")
    modules = [optim.build({"name": spec["name"], **options}, [parameters[i] for i in indices])
               for indices, options in resolved]
    hyper = [m.hyperparameters() for m in modules]
    spec = param_groups.metadata_spec(spec["name"], resolved, names, hyper)
    return Setup(spec, resolved, modules, trainable,
                 plan(spec, hyper, scheduler, scheduler_interval, clip_grad_norm, clip_norm_type, clip_grad_value,
                      accumulate))


def load_weights(model: nn.Module, weights: Union[str, os.PathLike, Dict[str, Tensor]]) -> None:
    """Load a state_dict (or a torch.save file of one, read with weights_only=True) into ``model``,
    strictly: every name the model has, no other, each with the model's shape."""
    where = "init weights"
    if not isinstance(weights, dict):
        where = f"init weights {weights}"
        try:
            weights = torch.load(str(weights), map_location="cpu", weights_only=True)
        except FileNotFoundError as ex:
            raise FineTuneError(f"{where}: no such file") from ex
        except Exception as ex:  # pickle or zip errors of many types
            raise FineTuneError(f"{where}: not a state_dict saved with torch.save ({str(ex).splitlines()[0]})") from ex
        if not isinstance(weights, dict):
            raise FineTuneError(f"{where}: holds a {type(weights).__name__}, not a state_dict")
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    if missing:
        raise FineTuneError(f"{where}: no value for {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if unexpected:
        raise FineTuneError(f"{where}: {unexpected[0]} is not in the model")
    for key, value in weights.items():
        if not torch.is_tensor(value) or tuple(value.shape) != tuple(own[key].shape):
            shape = list(value.shape) if torch.is_tensor(value) else type(value).__name__
            raise FineTuneError(f"{where}: {key} has shape {shape}, the model's has {list(own[key].shape)}")
    model.load_state_dict(weights, strict=True)
