"""Losses as small scriptable modules, each one call of torch.nn.functional.

The same module serves the exported training module (scripted) and the eager reference (not
scripted), so the spec -> function mapping lives here only. ``tests/test_losses.py`` checks each
against a direct torch.nn.functional call.
"""


from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .options import check

REDUCTIONS = ("mean", "sum")


def _check_reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"Invalid reduction {reduction!r}; expected one of {REDUCTIONS}")
    return reduction


def _optional_tensor(values: Optional[List[float]]) -> Optional[Tensor]:
    return None if values is None else torch.tensor(values, dtype=torch.float32)


class MSE(nn.Module):
    """``F.mse_loss``. Target: float, the prediction's shape."""

    target_dtypes = ("float32", "float64", "bfloat16", "float16")

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = _check_reduction(reduction)

    def options(self) -> Dict[str, Any]:
        return {"reduction": self.reduction}

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, reduction=self.reduction)


class L1(MSE):
    """``F.l1_loss``. Target: float, the prediction's shape."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1(nn.Module):
    """``F.smooth_l1_loss(beta=1.0)``. Target: float, the prediction's shape."""

    target_dtypes = ("float32", "float64", "bfloat16", "float16")

    def __init__(self, reduction: str = "mean", beta: float = 1.0):
        super().__init__()
        if beta < 0:
            raise ValueError(f"Invalid beta for smooth_l1: {beta} (must be >= 0)")
        self.reduction = _check_reduction(reduction)
        self.beta = float(beta)

    def options(self) -> Dict[str, Any]:
        return {"reduction": self.reduction, "beta": self.beta}

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class Huber(nn.Module):
    """``F.huber_loss(delta=1.0)``. Target: float, the prediction's shape."""

    target_dtypes = ("float32", "float64", "bfloat16", "float16")

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__()
        if delta <= 0:
            raise ValueError(f"Invalid delta for huber: {delta} (must be > 0)")
        self.reduction = _check_reduction(reduction)
        self.delta = float(delta)

    def options(self) -> Dict[str, Any]:
        return {"reduction": self.reduction, "delta": self.delta}

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class CrossEntropy(nn.Module):
    """``F.cross_entropy``: logits [N, C], target int64 class indices [N].

    Options: class ``weight`` (C floats), ``ignore_index`` (-100), ``label_smoothing`` (0.0).
    """

    target_dtypes = ("int64",)

    def __init__(self, reduction: str = "mean", weight: Optional[List[float]] = None, ignore_index: int = -100,
                 label_smoothing: float = 0.0):
        super().__init__()
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"Invalid label_smoothing: {label_smoothing} (must be in [0, 1])")
        self.reduction = _check_reduction(reduction)
        self.weight: Optional[Tensor] = _optional_tensor(weight)
        self.ignore_index = int(ignore_index)
        self.label_smoothing = float(label_smoothing)

    def options(self) -> Dict[str, Any]:
        return {"reduction": self.reduction, "weight": None if self.weight is None else self.weight.tolist(),
                "ignore_index": self.ignore_index, "label_smoothing": self.label_smoothing}

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLL(nn.Module):
    """``F.nll_loss``: log-probabilities [N, C], target int64 class indices [N]."""

    target_dtypes = ("int64",)

    def __init__(self, reduction: str = "mean", weight: Optional[List[float]] = None, ignore_index: int = -100):
        super().__init__()
        self.reduction = _check_reduction(reduction)
        self.weight: Optional[Tensor] = _optional_tensor(weight)
        self.ignore_index = int(ignore_index)

    def options(self) -> Dict[str, Any]:
        return {"reduction": self.reduction, "weight": None if self.weight is None else self.weight.tolist(),
                "ignore_index": self.ignore_index}

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index, reduction=self.reduction)


class BCEWithLogits(nn.Module):
    """``F.binary_cross_entropy_with_logits``: target float in [0, 1], the logits' shape.

    Option: ``pos_weight`` (one float per class, broadcast over the last dimension).
    """

    target_dtypes = ("float32", "float64", "bfloat16", "float16")

    def __init__(self, reduction: str = "mean", pos_weight: Optional[List[float]] = None):
        super().__init__()
        self.reduction = _check_reduction(reduction)
        self.pos_weight: Optional[Tensor] = _optional_tensor(pos_weight)

    def options(self) -> Dict[str, Any]:
        return {"reduction": self.reduction,
                "pos_weight": None if self.pos_weight is None else self.pos_weight.tolist()}

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(input, target, reduction=self.reduction, pos_weight=self.pos_weight)


#: name used by the CLI and the metadata -> class
LOSSES: Dict[str, type] = {
    "mse": MSE, "l1": L1, "smooth_l1": SmoothL1, "huber": Huber,
    "cross_entropy": CrossEntropy, "nll": NLL, "bce_with_logits": BCEWithLogits,
}

#: torch.nn loss classes that export_training_module accepts, -> (name, attributes to copy)
_TORCH_LOSSES = {
    nn.MSELoss: ("mse", ()), nn.L1Loss: ("l1", ()), nn.SmoothL1Loss: ("smooth_l1", ("beta",)),
    nn.HuberLoss: ("huber", ("delta",)),
    nn.CrossEntropyLoss: ("cross_entropy", ("weight", "ignore_index", "label_smoothing")),
    nn.NLLLoss: ("nll", ("weight", "ignore_index")), nn.BCEWithLogitsLoss: ("bce_with_logits", ("pos_weight",)),
}


def build(spec: Dict[str, Any]) -> nn.Module:
    """The loss module for a spec ``{"name": ..., options...}``."""
    options = dict(spec)
    name = options.pop("name", None)
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}; supported: {', '.join(LOSSES)}")
    check(f"loss {name}", LOSSES[name], options)
    return LOSSES[name](**options)


def resolve(loss: Union[str, Dict[str, Any], nn.Module]) -> Tuple[nn.Module, Dict[str, Any]]:
    """A loss as ``export_training_module`` takes it (a name, a spec or a torch.nn loss module): the
    module it builds and its whole spec, every option spelled out, for the metadata."""
    if isinstance(loss, str):
        given = {"name": loss}
    elif isinstance(loss, nn.Module):
        given = spec_of(loss)
    else:
        given = dict(loss)
    module = build(given)
    return module, {"name": given["name"], **module.options()}


def spec_of(loss: nn.Module) -> Dict[str, Any]:
    """The spec of a torch.nn loss module (e.g. ``nn.CrossEntropyLoss(label_smoothing=0.1)``)."""
    if type(loss) not in _TORCH_LOSSES:
        supported = ", ".join(cls.__name__ for cls in _TORCH_LOSSES)
        raise ValueError(f"Unknown loss {type(loss).__name__}; supported: {supported}")
    name, attributes = _TORCH_LOSSES[type(loss)]
    spec: Dict[str, Any] = {"name": name, "reduction": loss.reduction}
    for attribute in attributes:
        value = getattr(loss, attribute)
        if torch.is_tensor(value) and attribute in ("weight", "pos_weight"):
            if value.dtype != torch.float32:  # eager torch computes with it as it is; the export in float32
                raise ValueError(f"{type(loss).__name__}: {attribute} is {str(value.dtype).replace('torch.', '')}; "
                                 f"gradbridge holds loss weights in float32: pass a float32 tensor")
            value = value.tolist()
        spec[attribute] = value
    return spec
