"""Protocol 3's optimizer step and gradient clipping, written op by op (``export.protocol3_capture`` captures the
model's step; these graphs follow it): torch.optim's single-tensor op sequence per parameter, with the per-step
Python doubles as host scalars (``program.host_scalars``), and torch.nn.utils' clipping; the program's
``training`` spec and counters, and the optimizer state it starts from (built at the write)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import torch
from torch import Tensor

from .._runtime import oplist, program
from .. import messages
from ..errors import ExportError
from ..spec import optim
from . import finetune


class _Builder:
    """Writes an op list by hand (the optimizer's step, clipping): every input first, then the ops, each op's
    arguments filled in from its schema (defaults included) as ``oplist.from_fx`` does. Values: a slot
    (``{"t": n}``, what ``input`` and ``op`` return), a list of slots, or a Python constant."""

    def __init__(self) -> None:
        self.inputs: List[str] = []
        self.nodes: List[Dict[str, Any]] = []
        self.outputs: List[Dict[str, Any]] = []
        self.slots = 0

    def input(self, binding: str) -> Dict[str, int]:
        assert not self.nodes, "op list: inputs take the first slots"
        self.inputs.append(binding)
        self.slots += 1
        return {"t": self.slots - 1}

    @staticmethod
    def _encode(value: Any, type_text: str) -> Any:
        if isinstance(value, dict):
            return value
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            return {"tl": [v["t"] for v in value]}
        return oplist.encode_arg(value, {}, type_text)

    def op(self, name: str, overload: str, *args: Any, **kwargs: Any) -> Dict[str, int]:
        schema = oplist._overload(name, overload)._schema
        encoded = []
        for i, argument in enumerate(schema.arguments):
            if i < len(args) and not argument.kwarg_only:
                value = args[i]
            elif argument.name in kwargs:
                value = kwargs[argument.name]
            else:
                value = argument.default_value
            encoded.append(self._encode(value, str(argument.type)))
        returns = len(schema.returns)
        self.nodes.append({"op": name, "overload": overload, "args": encoded, "outputs": returns})
        self.slots += max(returns, 1)
        return {"t": self.slots - max(returns, 1)}

    def item(self, values: Dict[str, int], index: int) -> Dict[str, int]:
        self.nodes.append({"op": oplist.ITEM, "overload": "", "args": [values, {"i": index}], "outputs": 1})
        self.slots += 1
        return {"t": self.slots - 1}

    def output(self, value: Dict[str, int], binding: str) -> None:
        self.outputs.append({"ref": value["t"], "to": binding})

    def graph(self) -> Dict[str, Any]:
        return {"oplist_version": oplist.VERSION, "inputs": self.inputs, "nodes": self.nodes, "outputs": self.outputs}


#: Each optimizer's per-parameter state (torch.optim's keys) as its step graph reads it.
def _state_keys(name: str, hyper: Dict[str, Any]) -> List[str]:
    if name == "sgd":
        return ["momentum_buffer"] if hyper["momentum"] != 0 else []
    if name in ("adam", "adamw"):
        return ["step", "exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if hyper["amsgrad"] else [])
    if name == "rmsprop":
        return (["step", "square_avg"] + (["momentum_buffer"] if hyper["momentum"] > 0 else [])
                + (["grad_avg"] if hyper["centered"] else []))
    return ["step", "sum"]


def _scale_(b: _Builder, t: Any, factor: Any, dtype: torch.dtype) -> None:
    """``t.mul_(factor)`` bit for bit as eager ``Tensor.mul_(float)`` (``spec/scaling.py`` for TorchScript): a
    Python float reaches ATen as a wrapped-number tensor (``aten::mul_.Tensor``), which the CPU kernel multiplies
    in float32 for a bfloat16 or float16 tensor, where ``aten::mul_.Scalar`` rounds the factor to the tensor's
    dtype first (0.9 is 0.8984 in bfloat16). For a 16-bit tensor: ``mul_.Tensor`` by a constant (a wrapped
    number, ``oplist``'s number for a Tensor argument) or by a host scalar made a 0-dim float64 tensor
    (``aten::scalar_tensor``: the same float32 product); other dtypes keep ``mul_.Scalar``."""
    if dtype not in (torch.bfloat16, torch.float16):
        b.op("aten::mul_", "Scalar", t, factor)
        return
    if isinstance(factor, dict):  # a host scalar's slot
        factor = b.op("aten::scalar_tensor", "default", factor, dtype=torch.float64)
    b.op("aten::mul_", "Tensor", t, factor)


def _optimizer_graph(name: str, groups: Sequence[Tuple[List[str], Dict[str, Any]]], first: bool,
                     dtypes: Mapping[str, torch.dtype]) -> Dict[str, Any]:
    """One torch.optim step of every group, torch.optim's single-tensor op sequence per parameter (torch
    2.7-2.15; ``optimizer_first``: SGD's first step, which clones the gradient into the momentum buffer).
    The doubles torch.optim computes in Python per step are host scalars (``program.host_scalars``);
    ``dtypes``: each parameter's (its optimizer state's) dtype, for ``_scale_``."""
    b = _Builder()
    scalars = [{key: b.input(program.scalar_binding(key, g))
                for key in program.host_scalars(name, hyper, 1.0, 1)} for g, (_, hyper) in enumerate(groups)]
    slots = []
    for names, hyper in groups:
        keys = [k for k in _state_keys(name, hyper) if not (first and k == "momentum_buffer")]
        slots.append([(n, b.input(f"param:{n}"), b.input(f"grad:{n}"), {k: b.input(f"state:{k}:{n}") for k in keys})
                      for n in names])
    step = {"sgd": _sgd_step, "adam": _adam_step, "adamw": _adam_step, "rmsprop": _rmsprop_step,
            "adagrad": _adagrad_step}[name]
    for (_, hyper), params, scalar in zip(groups, slots, scalars):
        for n, param, grad, state in params:
            if hyper.get("maximize"):
                grad = b.op("aten::neg", "default", grad)
            step(b, n, dtypes[n], hyper, scalar, param, grad, state, first, name == "adamw")
    return b.graph()


def _sgd_step(b: _Builder, n: str, dtype: torch.dtype, h: Dict[str, Any], scalar: Dict[str, Any], param: Any,
              grad: Any, state: Dict[str, Any], first: bool, _: bool) -> None:
    if h["weight_decay"] != 0:
        grad = b.op("aten::add", "Tensor", grad, param, alpha=h["weight_decay"])
    if h["momentum"] != 0:
        if first:
            buf = b.op("aten::clone", "default", grad)
            b.output(buf, f"state:momentum_buffer:{n}")
        else:
            buf = state["momentum_buffer"]
            _scale_(b, buf, scalar["momentum"], dtype)
            b.op("aten::add_", "Tensor", buf, grad, alpha=1 - h["dampening"])
        grad = b.op("aten::add", "Tensor", grad, buf, alpha=scalar["momentum"]) if h["nesterov"] else buf
    b.op("aten::add_", "Tensor", param, grad, alpha=scalar["neg_lr"])


def _adam_step(b: _Builder, n: str, dtype: torch.dtype, h: Dict[str, Any], scalar: Dict[str, Any], param: Any,
               grad: Any, state: Dict[str, Any], first: bool, decoupled: bool) -> None:
    beta2 = h["betas"][1]
    b.op("aten::add_", "Scalar", state["step"], 1)
    if h["weight_decay"] != 0:
        if decoupled:
            _scale_(b, param, scalar["decay"], dtype)
        else:
            grad = b.op("aten::add", "Tensor", grad, param, alpha=h["weight_decay"])
    b.op("aten::lerp_", "Scalar", state["exp_avg"], grad, scalar["one_minus_beta1"])
    _scale_(b, state["exp_avg_sq"], beta2, dtype)
    b.op("aten::addcmul_", "default", state["exp_avg_sq"], grad, grad, value=1 - beta2)
    if h["amsgrad"]:
        b.op("aten::maximum", "out", state["max_exp_avg_sq"], state["exp_avg_sq"], out=state["max_exp_avg_sq"])
        root = b.op("aten::sqrt", "default", state["max_exp_avg_sq"])
    else:
        root = b.op("aten::sqrt", "default", state["exp_avg_sq"])
    denom = b.op("aten::div", "Scalar", root, scalar["bias_correction2_sqrt"])
    b.op("aten::add_", "Scalar", denom, h["eps"])
    b.op("aten::addcdiv_", "default", param, state["exp_avg"], denom, value=scalar["neg_step_size"])


def _rmsprop_step(b: _Builder, n: str, dtype: torch.dtype, h: Dict[str, Any], scalar: Dict[str, Any], param: Any,
                  grad: Any, state: Dict[str, Any], first: bool, _: bool) -> None:
    alpha = h["alpha"]
    b.op("aten::add_", "Scalar", state["step"], 1)
    if h["weight_decay"] != 0:
        grad = b.op("aten::add", "Tensor", grad, param, alpha=h["weight_decay"])
    _scale_(b, state["square_avg"], alpha, dtype)
    b.op("aten::addcmul_", "default", state["square_avg"], grad, grad, value=1 - alpha)
    if h["centered"]:
        b.op("aten::lerp_", "Scalar", state["grad_avg"], grad, 1 - alpha)
        avg = b.op("aten::addcmul", "default", state["square_avg"], state["grad_avg"], state["grad_avg"], value=-1)
        b.op("aten::sqrt_", "default", avg)
    else:
        avg = b.op("aten::sqrt", "default", state["square_avg"])
    b.op("aten::add_", "Scalar", avg, h["eps"])
    if h["momentum"] > 0:
        _scale_(b, state["momentum_buffer"], scalar["momentum"], dtype)
        b.op("aten::addcdiv_", "default", state["momentum_buffer"], grad, avg)
        b.op("aten::add_", "Tensor", param, state["momentum_buffer"], alpha=scalar["neg_lr"])
    else:
        b.op("aten::addcdiv_", "default", param, grad, avg, value=scalar["neg_lr"])


def _adagrad_step(b: _Builder, n: str, dtype: torch.dtype, h: Dict[str, Any], scalar: Dict[str, Any], param: Any,
                  grad: Any, state: Dict[str, Any], first: bool, _: bool) -> None:
    b.op("aten::add_", "Scalar", state["step"], 1)
    if h["weight_decay"] != 0:
        grad = b.op("aten::add", "Tensor", grad, param, alpha=h["weight_decay"])
    b.op("aten::addcmul_", "default", state["sum"], grad, grad, value=1)
    std = b.op("aten::sqrt", "default", state["sum"])
    b.op("aten::add_", "Scalar", std, h["eps"])
    b.op("aten::addcdiv_", "default", param, grad, std, value=scalar["neg_clr"])


def clip_graph(named: Sequence[Tuple[str, Tensor]], clip: Dict[str, Any]) -> Dict[str, Any]:
    """torch.nn.utils.clip_grad_norm_ / clip_grad_value_ over the trainable parameters in the model's order,
    in place: on CPU their foreach ops, per group of one dtype (torch groups the gradients by dtype)."""
    b = _Builder()
    grads = {n: b.input(f"grad:{n}") for n, _ in named}
    by_dtype: Dict[torch.dtype, List[Any]] = {}
    for n, p in named:
        by_dtype.setdefault(p.dtype, []).append(grads[n])
    if clip["kind"] == "value":
        for group in by_dtype.values():
            b.op("aten::_foreach_clamp_min_", "Scalar", group, -clip["max"])
            b.op("aten::_foreach_clamp_max_", "Scalar", group, clip["max"])
        return b.graph()
    norm_type = clip["norm_type"]
    norms = []
    for group in by_dtype.values():
        listed = b.op("aten::_foreach_norm", "Scalar", group, norm_type)
        norms += [b.item(listed, i) for i in range(len(group))]
    total = b.op("aten::linalg_vector_norm", "default", b.op("aten::stack", "default", norms), norm_type)
    # eager `max_norm / (total_norm + 1e-6)` is Tensor.__rtruediv__: reciprocal() * max_norm
    coef = b.op("aten::mul", "Scalar", b.op("aten::reciprocal", "default", b.op("aten::add", "Scalar", total, 1e-6)),
                clip["max"])
    clamped = b.op("aten::clamp", "default", coef, None, 1.0)
    for group in by_dtype.values():
        b.op("aten::_foreach_mul_", "Tensor", group, clamped)
    return b.graph()


def optimizer_graphs(training: Dict[str, Any], dtypes: Mapping[str, torch.dtype]) -> Dict[str, Dict[str, Any]]:
    """The step graphs of ``training``'s optimizer; ``dtypes``: each parameter's dtype (its state's)."""
    name = training["optimizer"]
    groups = [(group["params"], group) for group in training["groups"]]
    graphs = {"optimizer": _optimizer_graph(name, groups, False, dtypes)}
    if name == "sgd" and any(hyper["momentum"] != 0 for _, hyper in groups):
        graphs["optimizer_first"] = _optimizer_graph(name, groups, True, dtypes)
    return graphs


def drop_from_groups(training: Dict[str, Any], idle: Sequence[str]) -> None:
    """Parameters without a gradient leave their groups: no step, no optimizer state, as in torch.optim."""
    for group in training["groups"]:
        group["params"] = [n for n in group["params"] if n not in idle]


def initial_state(setup: finetune.Setup, named: Sequence[Tuple[str, Tensor]]) -> Dict[str, Tensor]:
    """torch.optim's state before the first step, as the TorchScript path's optimizers hold it (SGD's
    momentum buffer comes with step 1): each group's optimizer built again now, at the write (the export's
    were let go before the capture, so a large model's optimizer state is not held while it runs)."""
    state: Dict[str, Tensor] = {}
    if setup.spec["name"] == "sgd":
        return state
    for indices, options in setup.resolved:
        module = optim.build({"name": setup.spec["name"], **options}, [named[i][1] for i in indices])
        for key, values in module.state().items():
            for i, value in zip(indices, values):
                state[f"state:{key}:{named[i][0]}"] = value.detach()  # written, then let go: not copied
    return state


def training_spec(setup: finetune.Setup, names: Sequence[str]) -> Tuple[Dict[str, Any], Dict[str, Any], Any]:
    """``program.training`` and ``program.counters`` (see ``program``), and the schedule module, or refused
    in one line."""
    plan = setup.plan
    spec = setup.spec
    if spec["name"] not in program.OPTIMIZERS:
        raise ExportError(messages.protocol3_optimizer_refused(spec["name"], program.OPTIMIZERS))
    training: Dict[str, Any] = {
        "optimizer": spec["name"],
        "groups": [{"params": [names[i] for i in indices], **module.hyperparameters()}
                   for (indices, _), module in zip(setup.resolved, setup.optimizers)],
        "accumulate": plan.accumulate, "scheduler_interval": plan.interval}
    schedule = None
    if "scheduler" in plan.metadata:
        kind = plan.metadata["scheduler"]["name"]
        if kind not in program.SCHEDULERS:
            raise ExportError(messages.aten_option_refused(f"scheduler {kind} (it holds {', '.join(program.SCHEDULERS)})"))
        schedule = plan.scheduler_module
        training["scheduler"] = program.schedule_spec(plan.metadata["scheduler"], schedule)
    counters = program.initial_counters(plan.lrs, schedule)
    if counters["momenta"]:
        _cycle_momentum(training, schedule)
    return training, counters, schedule


_OPTIMIZER_NAMES = {"sgd": "SGD", "rmsprop": "RMSprop"}


def _cycle_momentum(training: Dict[str, Any], schedule: Any) -> None:
    """OneCycleLR cycles the momentum of SGD and RMSprop, or Adam's beta1: a host scalar per step
    (``program.host_scalars``); the groups hold the cycle's start, as torch's construction sets it, so the step
    graph has the momentum ops. A cycle through momentum 0 (torch then skips the buffer) is refused."""
    name = training["optimizer"]
    for group, start, low, high in zip(training["groups"], schedule.last_momenta, schedule.base_momenta,
                                       schedule.max_momenta):
        if name in ("sgd", "rmsprop"):
            if min(low, high) <= 0:
                raise ExportError(messages.aten_option_refused(
                    f"OneCycleLR cycling {_OPTIMIZER_NAMES[name]}'s momentum through {min(low, high)} "
                    "(base_momentum and max_momentum above 0 are held)"))
            group["momentum"] = start
        else:
            group["betas"] = [start, group["betas"][1]]
