"""Learning-rate schedules: torch scheduler -> spec -> scripted module (``scheduler_modules``) or the real
torch scheduler again, and the checks on a spec. A spec ``{"name": "cosine", "T_max": 100, ...}``
round-trips through the metadata; the Python reference rebuilds the real torch scheduler from it
(``torch_scheduler``).

Every scripted schedule has::

    step(lrs) -> lrs           # one scheduler.step(); lrs: one per parameter group
    step_metric(lrs, metric)   # ReduceLROnPlateau.step(metric); the others ignore the metric
"""


import math
from typing import Any, Dict

import torch
from torch import nn

from ..errors import GradbridgeError
from .options import is_integer as _is_int, is_number as _is_float, tensor_refused
from .scheduler_modules import (CosineAnnealingLR, ExponentialLR, LinearLR, MultiStepLR, OneCycleLR, ReduceLROnPlateau,
                                SequentialLR, StepLR)

#: torch class name -> spec name; what export accepts.
SUPPORTED = {"StepLR": "step", "MultiStepLR": "multistep", "ExponentialLR": "exponential",
             "CosineAnnealingLR": "cosine", "LinearLR": "linear", "OneCycleLR": "onecycle",
             "SequentialLR": "sequential", "ReduceLROnPlateau": "plateau"}
INTERVALS = ("step", "epoch")


def unsupported_message(what: str) -> str:
    """The one wording for a scheduler gradbridge cannot export."""
    return f"cannot export scheduler {what}; supported: {', '.join(SUPPORTED)}"


# ---- specs: torch instance -> spec -> scripted module / torch instance ----

def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def spec_of(scheduler: Any) -> Dict[str, Any]:
    """The spec of a fresh torch scheduler (constructed, never stepped)."""
    from torch.optim import lr_scheduler as ls

    _check_torch_class(scheduler)
    name = type(scheduler).__name__
    if isinstance(scheduler, ls.ReduceLROnPlateau):
        if scheduler.last_epoch != 0:
            raise GradbridgeError("ReduceLROnPlateau has already stepped; export a fresh scheduler")
        return {"name": "plateau", "mode": scheduler.mode, "factor": scheduler.factor, "patience": scheduler.patience,
                "threshold": scheduler.threshold, "threshold_mode": scheduler.threshold_mode,
                "cooldown": scheduler.cooldown, "min_lr": list(scheduler.min_lrs), "eps": scheduler.eps}
    if scheduler.last_epoch != 0:
        raise GradbridgeError(f"{name} has already stepped (last_epoch {scheduler.last_epoch}); export a fresh scheduler")
    if isinstance(scheduler, ls.SequentialLR):
        return {"name": "sequential", "milestones": list(scheduler._milestones),
                "schedulers": [_child_spec(s) for s in scheduler._schedulers]}
    return _child_spec(scheduler)


def check_tensors(scheduler: Any) -> None:
    """OneCycleLR's own options as tensors (they turn the groups' lr into one): refused by name."""
    from torch.optim import lr_scheduler as ls

    if isinstance(scheduler, ls.OneCycleLR):
        for index, g in enumerate(scheduler.optimizer.param_groups):
            for key in ("max_lr", "max_momentum", "base_momentum"):
                if torch.is_tensor(g.get(key)):
                    raise GradbridgeError(tensor_refused(f"OneCycleLR parameter group {index}", key, g[key]))


def _check_torch_class(scheduler: Any) -> None:
    """Only torch's own classes: a subclass or a look-alike may compute anything."""
    from torch.optim import lr_scheduler as ls

    cls = type(scheduler)
    name = cls.__name__
    if name in SUPPORTED and cls.__module__ != ls.__name__:
        raise GradbridgeError(f"cannot export scheduler {cls.__module__}.{cls.__qualname__}: it is not "
                              f"torch.optim.lr_scheduler.{name} (a subclass or another class of that name may "
                              f"compute other lrs); use torch's {name}")
    if name not in SUPPORTED:
        raise GradbridgeError(unsupported_message(name))


def _child_spec(s: Any) -> Dict[str, Any]:
    from torch.optim import lr_scheduler as ls

    _check_torch_class(s)
    name = type(s).__name__
    if isinstance(s, ls.StepLR):
        return {"name": "step", "step_size": s.step_size, "gamma": s.gamma}
    if isinstance(s, ls.MultiStepLR):
        return {"name": "multistep", "milestones": sorted(s.milestones.elements()), "gamma": s.gamma}
    if isinstance(s, ls.ExponentialLR):
        return {"name": "exponential", "gamma": s.gamma}
    if isinstance(s, ls.CosineAnnealingLR):
        return {"name": "cosine", "T_max": s.T_max, "eta_min": s.eta_min}
    if isinstance(s, ls.LinearLR):
        return {"name": "linear", "start_factor": s.start_factor, "end_factor": s.end_factor,
                "total_iters": s.total_iters}
    if isinstance(s, ls.OneCycleLR):
        check_tensors(s)
        group = s.optimizer.param_groups[0]
        momentum = ({"cycle_momentum": True, "max_momentum": [g["max_momentum"] for g in s.optimizer.param_groups],
                     "base_momentum": [g["base_momentum"] for g in s.optimizer.param_groups]}
                    if s.cycle_momentum else {"cycle_momentum": False})
        phases = s._schedule_phases
        total = s.total_steps
        # torch keeps only derived values; recover options that reproduce them exactly.
        pct = _invert(lambda p: float(p * total) - 1, phases[0]["end_step"], (phases[0]["end_step"] + 1) / total)
        div = _invert(lambda d: group["max_lr"] / d, group["initial_lr"], group["max_lr"] / group["initial_lr"])
        final = _invert(lambda d: group["initial_lr"] / d, group["min_lr"], group["initial_lr"] / group["min_lr"])
        return {"name": "onecycle", "max_lr": [g["max_lr"] for g in s.optimizer.param_groups],
                "total_steps": total, "pct_start": pct, "div_factor": div, "final_div_factor": final,
                "three_phase": len(phases) == 3, "anneal_strategy": s._anneal_func_type, **momentum}
    raise GradbridgeError(unsupported_message(name))


def _invert(f, target: float, guess: float) -> float:
    """An x near ``guess`` with f(x) == target exactly (a few ulps either way)."""
    candidates = [guess]
    up = down = guess
    for _ in range(8):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        candidates += [up, down]
    for x in candidates:
        if f(x) == target:
            return x
    return guess


#: Each spec's options and their kinds ("int", "float", "bool", "ints", "floats": a number or one
#: per group, "list" of specs, or a tuple of choices); REQUIRED: those without a default.
OPTIONS: Dict[str, Dict[str, Any]] = {
    "step": {"step_size": "int", "gamma": "float"},
    "multistep": {"milestones": "ints", "gamma": "float"},
    "exponential": {"gamma": "float"},
    "cosine": {"T_max": "int", "eta_min": "float"},
    "linear": {"start_factor": "float", "end_factor": "float", "total_iters": "int"},
    "onecycle": {"max_lr": "floats", "total_steps": "int", "pct_start": "float", "div_factor": "float",
                 "final_div_factor": "float", "three_phase": "bool", "anneal_strategy": ("cos", "linear"),
                 "cycle_momentum": "bool", "max_momentum": "floats", "base_momentum": "floats"},
    "plateau": {"mode": ("min", "max"), "factor": "float", "patience": "int", "threshold": "float",
                "threshold_mode": ("rel", "abs"), "cooldown": "int", "min_lr": "floats", "eps": "float"},
    "sequential": {"schedulers": "list", "milestones": "ints"},
}
REQUIRED = {"step": ("step_size",), "multistep": ("milestones",), "exponential": ("gamma",), "cosine": ("T_max",),
            "onecycle": ("max_lr", "total_steps"), "sequential": ("schedulers", "milestones")}


def _check_option(name: str, key: str, kind: Any, value: Any, groups: int) -> None:
    where = f"scheduler {name}"
    if torch.is_tensor(value) or (isinstance(value, (list, tuple)) and any(torch.is_tensor(v) for v in value)):
        raise ValueError(tensor_refused(where, key, value))
    if isinstance(kind, tuple):
        _check(value in kind, f"{where}: {key} must be one of {', '.join(kind)}, got {value!r}")
    elif kind == "int":
        _check(_is_int(value), f"{where}: {key} must be an integer, got {value!r}")
    elif kind == "float":
        _check(_is_float(value), f"{where}: {key} must be a number, got {value!r}")
    elif kind == "bool":
        _check(isinstance(value, bool), f"{where}: {key} must be true or false, got {value!r}")
    elif kind == "ints":
        _check(isinstance(value, (list, tuple)) and all(map(_is_int, value)),
               f"{where}: {key} must be a list of integers, got {value!r}")
    elif kind == "floats":
        one_per_group = isinstance(value, (list, tuple)) and len(value) == groups and all(map(_is_float, value))
        _check(_is_float(value) or one_per_group,
               f"{where}: {key} must be a number or one per parameter group ({groups}), got {value!r}")
    elif kind == "list":
        _check(isinstance(value, (list, tuple)) and all(isinstance(c, dict) for c in value),
               f"{where}: {key} must be a list of scheduler specs, got {value!r}")


def validate(spec: Dict[str, Any], groups: int) -> None:
    """Refuse unknown, missing, mistyped or out-of-range settings before anything is written (one
    line naming the setting): an int option never takes a float (torch would compute with it)."""
    name = spec.get("name")
    if name not in SUPPORTED.values():
        raise ValueError(unsupported_message(repr(name)))
    options = OPTIONS[name]
    for key, value in spec.items():
        if key == "name":
            continue
        _check(key in options, f"scheduler {name}: unknown option {key!r}; options: {', '.join(options)}")
        _check_option(name, key, options[key], value, groups)
    for key in REQUIRED.get(name, ()):
        _check(key in spec, f"scheduler {name}: {key} is required (e.g. {name}:{key}=...)")
    if name == "step":
        _check(int(spec["step_size"]) > 0, f"scheduler step: step_size must be positive, got {spec['step_size']}")
    elif name == "cosine":
        _check(int(spec["T_max"]) > 0, f"scheduler cosine: T_max must be positive, got {spec['T_max']}")
    elif name == "linear":
        _check(int(spec.get("total_iters", 5)) > 0,
               f"scheduler linear: total_iters must be positive, got {spec.get('total_iters')}")
    elif name == "onecycle":
        _check(int(spec["total_steps"]) > 0, f"scheduler onecycle: total_steps must be positive, got {spec['total_steps']}")
    elif name == "exponential":
        _check(float(spec["gamma"]) > 0, f"scheduler exponential: gamma must be positive, got {spec['gamma']}")
    elif name == "plateau":
        _check(int(spec.get("patience", 10)) >= 0, f"scheduler plateau: patience must be >= 0, got {spec.get('patience')}")
    elif name == "sequential":
        children = spec["schedulers"]
        _check(len(spec["milestones"]) == len(children) - 1,
               "scheduler sequential: needs one milestone fewer than schedulers")
        _check(all(int(m) > 0 for m in spec["milestones"]),
               f"scheduler sequential: milestones must be positive, got {spec['milestones']}")
        for child in children:
            _check(child.get("name") not in ("sequential", "plateau", "onecycle"),
                   f"scheduler sequential: cannot hold {child.get('name')}")
            validate(child, groups)


def torch_scheduler(spec: Dict[str, Any], optimizer: torch.optim.Optimizer):
    """The torch scheduler the spec describes, over a fresh torch optimizer (the reference)."""
    from torch.optim import lr_scheduler as ls

    options = {k: v for k, v in spec.items() if k != "name"}
    name = spec["name"]
    if name == "sequential":
        children = [torch_scheduler(c, optimizer) for c in spec["schedulers"]]
        return ls.SequentialLR(optimizer, children, list(spec["milestones"]))
    if name == "plateau":
        return ls.ReduceLROnPlateau(optimizer, **options)
    if name == "onecycle":
        return ls.OneCycleLR(optimizer, **options)
    cls = {v: k for k, v in SUPPORTED.items()}[name]
    return getattr(ls, cls)(optimizer, **options)


def build(spec: Dict[str, Any], optimizer: torch.optim.Optimizer) -> nn.Module:
    """The scripted schedule for ``spec``, in the state of a fresh torch scheduler built over
    ``optimizer`` (a torch optimizer with the export's groups, already stepped by that
    scheduler's construction: its lrs are the scripted module's starting lrs)."""
    base_lrs = [g.get("initial_lr", g["lr"]) for g in optimizer.param_groups]
    name = spec["name"]
    options = {k: v for k, v in spec.items() if k != "name"}
    if name == "step":
        return StepLR(base_lrs, **options)
    if name == "multistep":
        return MultiStepLR(base_lrs, **options)
    if name == "exponential":
        return ExponentialLR(base_lrs, **options)
    if name == "cosine":
        return CosineAnnealingLR(base_lrs, **options)
    if name == "linear":
        return LinearLR(base_lrs, **options)
    if name == "onecycle":
        groups = len(optimizer.param_groups)
        max_lr = options.pop("max_lr")
        max_lrs = list(max_lr) if isinstance(max_lr, (list, tuple)) else [max_lr] * groups
        options.setdefault("pct_start", 0.3)
        options.setdefault("div_factor", 25.0)
        options.setdefault("final_div_factor", 1e4)
        options.setdefault("three_phase", False)
        options.setdefault("anneal_strategy", "cos")
        cycle = bool(options.pop("cycle_momentum", True))
        options.pop("max_momentum", None)
        options.pop("base_momentum", None)
        # torch wrote each group's max/base momentum into the groups at construction
        return OneCycleLR(base_lrs, max_lrs, cycle_momentum=cycle,
                          max_momenta=[g["max_momentum"] for g in optimizer.param_groups] if cycle else [],
                          base_momenta=[g["base_momentum"] for g in optimizer.param_groups] if cycle else [],
                          **options)
    if name == "sequential":
        return SequentialLR(base_lrs, [build(c, optimizer) for c in spec["schedulers"]], spec["milestones"])
    if name == "plateau":
        min_lr = options.pop("min_lr", 0.0)
        groups = len(optimizer.param_groups)
        options["min_lrs"] = list(min_lr) if isinstance(min_lr, (list, tuple)) else [float(min_lr)] * groups
        return ReduceLROnPlateau(base_lrs, **options)
    raise ValueError(unsupported_message(repr(name)))
