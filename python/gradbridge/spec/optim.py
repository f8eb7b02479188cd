"""The optimizer specs: a name and its hyper-parameters (``{"name": "adam", "lr": ...}``), the scripted
module each becomes (``spec.optimizers``: SGD, Adam, AdamW, RMSprop, Adagrad, op for op torch.optim's
single-tensor path), and the way back and forth between a spec and a torch.optim optimizer."""


from typing import Any, Dict, Sequence

import torch
from torch import Tensor, nn

from .. import protocol
from ..errors import GradbridgeError
from .optimizers.adagrad import Adagrad
from .optimizers.adam import Adam, AdamW
from .optimizers.rmsprop import RMSprop
from .optimizers.sgd import SGD
from .options import check, tensor_refused


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
