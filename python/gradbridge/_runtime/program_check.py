"""A protocol-3 program's fields read as data (``program.training``, ``program.counters``, the state entries):
each of the type and in the range torch accepts, before the first step, one line naming the field. No
schedule then divides by zero (StepLR's step_size, CosineAnnealingLR's T_max, LinearLR's total_iters are 1
or more) or overflows (every count at most ``count``); no learning rate is negative or NaN, no beta outside
[0, 1). Java's twin: ``dev.gradbridge.ProgramCheck``.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping

from .oplist_check import (INTERVALS, LIMITS, OPTIMIZER_FIELDS, RESTARTABLE, SIGNED, array, fail, finite_hex,
                           flag, hex_double, integer, member, number, shown, text, DTYPES)

COUNT = LIMITS["count"]
#: bytes per element of each dtype a state entry may hold
ITEMSIZE = {"uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2, "float32": 4, "float64": 8,
            "bool": 1, "bfloat16": 2}
assert tuple(ITEMSIZE) == DTYPES


def check_training(training: Any, counters: Any, where: str = "program") -> None:
    """``program.training`` and ``program.counters``."""
    at = f"{where}.training"
    if not isinstance(training, dict):
        fail(at, f"{shown(training)} is not an object")
    optimizer = text(member(training, "optimizer", at), at, "optimizer")
    if optimizer not in OPTIMIZER_FIELDS:
        fail(at, f"optimizer is {shown(optimizer)}, expected one of {', '.join(OPTIMIZER_FIELDS)}")
    groups = array(member(training, "groups", at), at, "groups")
    if not groups:
        fail(at, "groups is empty")
    for g, group in enumerate(groups):
        _group(optimizer, group, f"{at}.groups[{g}]")
    integer(member(training, "accumulate", at), at, "accumulate", 1, LIMITS["accumulate"])
    interval = text(member(training, "scheduler_interval", at), at, "scheduler_interval")
    if interval not in INTERVALS:
        fail(at, f"scheduler_interval is {shown(interval)}, expected one of {', '.join(INTERVALS)}")
    spec = training.get("scheduler")
    children = 0
    if spec is not None:
        schedule(spec, len(groups), f"{at}.scheduler")
        children = len(spec["schedulers"]) if spec["name"] == "sequential" else 0
    _counters(counters, len(groups), spec, children, f"{where}.counters")


def _group(optimizer: str, group: Any, where: str) -> None:
    if not isinstance(group, dict):
        fail(where, f"{shown(group)} is not an object")
    for k, name in enumerate(array(member(group, "params", where), where, "params")):
        text(name, where, f"params[{k}]")
    for field, kind in OPTIMIZER_FIELDS[optimizer].items():
        value = member(group, field, where)
        if kind == "bool":
            flag(value, where, field)
        elif kind == "betas":
            betas = array(value, where, field)
            if len(betas) != 2:
                fail(where, f"betas is {shown(betas)}, expected [beta1, beta2]")
            for k, beta in enumerate(betas):
                number(beta, where, f"betas[{k}]", 0.0, 1.0, below_high=True)
        else:
            number(value, where, field, -math.inf if field in SIGNED else 0.0)


def schedule(spec: Any, groups: int, where: str) -> None:
    """A resolved schedule (``program.schedule_spec``)."""
    if not isinstance(spec, dict):
        fail(where, f"{shown(spec)} is not an object")
    name = text(member(spec, "name", where), where, "name")
    where = f"{where} ({shown(name)})"
    lrs = _hexes(member(spec, "base_lrs", where), where, "base_lrs", 0.0)
    if len(lrs) != groups:
        fail(where, f"base_lrs holds {len(lrs)} values for {groups} parameter groups")

    def count(key: str, low: int = 0) -> int:
        return integer(member(spec, key, where), where, key, low, COUNT)

    def finite(key: str, low: float = -math.inf, high: float = math.inf, **open_: bool) -> float:
        return number(member(spec, key, where), where, key, low, high, **open_)

    if name == "step":
        count("step_size", 1)
        finite("gamma")
    elif name == "multistep":
        _counts(member(spec, "milestones", where), where, "milestones", 0)
        finite("gamma")
    elif name == "exponential":
        finite("gamma", 0.0, above_low=True)
    elif name == "cosine":
        count("T_max", 1)
        finite("eta_min")
    elif name == "linear":
        finite("start_factor", 0.0, 1.0, above_low=True)
        finite("end_factor", 0.0, 1.0)
        count("total_iters", 1)
    elif name == "plateau":
        flag(member(spec, "minimize", where), where, "minimize")
        flag(member(spec, "relative", where), where, "relative")
        finite("factor", 0.0, 1.0, below_high=True)
        count("patience")
        finite("threshold", 0.0)
        count("cooldown")
        if len(_hexes(member(spec, "min_lrs", where), where, "min_lrs", 0.0)) != groups:
            fail(where, f"min_lrs holds another number of values than the {groups} parameter groups")
        finite("eps", 0.0)
    elif name == "sequential":
        milestones = _counts(member(spec, "milestones", where), where, "milestones", 1)
        children = array(member(spec, "schedulers", where), where, "schedulers")
        if len(children) != len(milestones) + 1:
            fail(where, f"{len(children)} schedulers for {len(milestones)} milestones, expected one more")
        for k, child in enumerate(children):
            schedule(child, groups, f"{where}.schedulers[{k}]")
            if child["name"] not in RESTARTABLE:
                fail(where, f"schedulers[{k}] is {shown(child['name'])}, expected one of {', '.join(RESTARTABLE)}")
    elif name == "onecycle":
        _one_cycle(spec, groups, where)
    else:
        fail(where, f"unknown scheduler {shown(name)}")


def _one_cycle(spec: Mapping[str, Any], groups: int, where: str) -> None:
    integer(member(spec, "total_steps", where), where, "total_steps", 1, COUNT)
    cycle = flag(member(spec, "cycle_momentum", where), where, "cycle_momentum")
    flag(member(spec, "cos", where), where, "cos")
    phases = len(_hexes(member(spec, "end_steps", where), where, "end_steps", 0.0))
    if phases == 0:
        fail(where, "end_steps is empty")
    for key in ("initial", "max_lrs", "min_lrs", "max_momenta", "base_momenta"):
        values = _hexes(member(spec, key, where), where, key, 0.0)
        if len(values) != groups and (cycle or key not in ("max_momenta", "base_momenta")):
            fail(where, f"{key} holds {len(values)} values for {groups} parameter groups")
    for key in ("start_keys", "end_keys", "start_momentum_keys", "end_momentum_keys"):
        keys = array(member(spec, key, where), where, key)
        if len(keys) != phases:
            fail(where, f"{key} holds {len(keys)} values for {phases} phases")
        for k, value in enumerate(keys):
            integer(value, where, f"{key}[{k}]", 0, 4)


def _counts(value: Any, where: str, field: str, low: int) -> List[int]:
    return [integer(v, where, f"{field}[{k}]", low, COUNT) for k, v in enumerate(array(value, where, field))]


def _hexes(value: Any, where: str, field: str, low: float = -math.inf) -> List[float]:
    return [finite_hex(v, where, f"{field}[{k}]", low) for k, v in enumerate(array(value, where, field))]


def _counters(counters: Any, groups: int, spec: Any, children: int, where: str) -> None:
    if not isinstance(counters, dict):
        fail(where, f"{shown(counters)} is not an object")
    integer(member(counters, "steps", where), where, "steps", 0, COUNT)
    if len(_hexes(member(counters, "lrs", where), where, "lrs", 0.0)) != groups:
        fail(where, f"lrs holds another number of learning rates than the {groups} parameter groups")
    integer(member(counters, "last_epoch", where), where, "last_epoch", -1, COUNT)
    hex_double(member(counters, "best", where), where, "best")
    integer(member(counters, "num_bad_epochs", where), where, "num_bad_epochs", 0, COUNT)
    integer(member(counters, "cooldown_counter", where), where, "cooldown_counter", 0, COUNT)
    epochs = array(member(counters, "children_last_epochs", where), where, "children_last_epochs")
    if len(epochs) != children:
        fail(where, f"children_last_epochs holds {len(epochs)} epochs for {children} schedules")
    for k, value in enumerate(epochs):
        integer(value, where, f"children_last_epochs[{k}]", -1, COUNT)
    momenta = _hexes(counters.get("momenta", []), where, "momenta")
    cycled = isinstance(spec, dict) and spec.get("name") == "onecycle" and spec.get("cycle_momentum") is True
    if momenta and (not cycled or len(momenta) != groups):
        fail(where, f"momenta holds {len(momenta)} values for {groups} parameter groups of a schedule that cycles "
                    f"{'them' if cycled else 'none'}")


def state_entry(entry: Any, where: str) -> Dict[str, Any]:
    """A state entry ({name, dtype, shape, file}); its byte count at most ``state_bytes`` (computed without
    overflow)."""
    if not isinstance(entry, dict):
        fail(where, f"{shown(entry)} is not an object")
    name = text(member(entry, "name", where), where, "name")
    where = f"{where} ({shown(name)})"
    text(member(entry, "file", where), where, "file")
    dtype = text(member(entry, "dtype", where), where, "dtype")
    shape = [integer(d, where, f"shape[{k}]", 0, LIMITS["state_bytes"])
             for k, d in enumerate(array(member(entry, "shape", where), where, "shape"))]
    if len(shape) > 64:
        fail(where, f"shape has {len(shape)} dimensions, more than 64")
    size = ITEMSIZE.get(dtype, 1)
    for d in shape:
        size *= d
        if size > LIMITS["state_bytes"]:
            fail(where, f"shape {shape} holds more than the limit of {LIMITS['state_bytes']} bytes")
    return entry
