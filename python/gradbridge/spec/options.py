"""Options of the exported optimizers and losses, checked against their constructors' signatures.

A wrong type is refused by name, never converted: ``lr="abc"``, ``ignore_index=1.5`` or a tensor
hyper-parameter would otherwise become a double (or an int) that eager torch never computes with.
"""

from __future__ import annotations

import inspect
import numbers
from typing import Any, Dict

import torch


def tensor_refused(where: str, key: str, value: Any) -> str:
    """The one wording for a tensor hyper-parameter (``lr=torch.tensor(0.5)``): eager torch keeps it
    a float32 tensor and rounds every value a schedule gives it to float32; the export holds doubles."""
    return (f"{where}: {key} is a tensor, which torch computes with in float32 (rounding every value it takes, "
            f"scheduled ones too); gradbridge exports Python numbers: pass {key} as a float")


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not torch.is_tensor(value)


def is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _has_tensor(value: Any) -> bool:
    return torch.is_tensor(value) or (isinstance(value, (list, tuple)) and any(torch.is_tensor(v) for v in value))


def check(where: str, cls: type, options: Dict[str, Any]) -> None:
    """Every option a keyword of ``cls.__init__`` of its default's kind: bool, str, int, a number,
    a tuple of numbers, or (default None) a list of numbers. One ValueError line naming it."""
    signature = inspect.signature(cls.__init__).parameters
    accepted = [k for k in signature if k not in ("self", "params")]
    for key, value in options.items():
        if key not in accepted:
            raise ValueError(f"{where}: unknown option {key!r}; options: {', '.join(accepted)}")
        if _has_tensor(value):
            raise ValueError(tensor_refused(where, key, value))
        default = signature[key].default
        if isinstance(default, bool):
            ok, expected = isinstance(value, bool), "true or false"
        elif isinstance(default, str):
            ok, expected = isinstance(value, str), "a string"
        elif isinstance(default, int) and not isinstance(default, bool):
            ok, expected = is_integer(value), "an integer"
        elif isinstance(default, tuple):
            ok = isinstance(value, (list, tuple)) and len(value) == len(default) and all(map(is_number, value))
            expected = f"{len(default)} numbers"
        elif default is None:
            ok = value is None or (isinstance(value, (list, tuple)) and all(map(is_number, value)))
            expected = "a list of numbers"
        else:
            ok, expected = is_number(value), "a number"
        if not ok:
            raise ValueError(f"{where}: {key} must be {expected}, got {value!r}")
