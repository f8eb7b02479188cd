"""What `gradbridge export` makes of its options: the model (built-in or ``MODULE:FACTORY``), the
optimizer, loss and fine-tuning specs from ``KEY=VALUE`` texts, a built-in model's sizes from the
input and target shapes, then the export. Every refusal is one GradbridgeError line naming the option."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .. import protocol
from ..errors import GradbridgeError
from .._runtime.files import check_writable
from ..models import BUILTIN_MODELS

#: Losses whose targets are class indices (int64, one per sample) rather than values.
CLASS_TARGET_LOSSES = ("cross_entropy", "nll")


def load_factory(reference: str):
    """``package.module:factory`` -> the callable (the current directory is importable)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise GradbridgeError(f"model {reference!r}: expected MODULE:FACTORY or one of {', '.join(BUILTIN_MODELS)}")
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as ex:
        raise GradbridgeError(f"model {reference!r}: cannot import {module_name}: {ex}") from ex
    finally:
        sys.path.pop(0)
    if not hasattr(module, attribute):
        raise GradbridgeError(f"model {reference!r}: module {module_name} has no attribute {attribute!r}")
    return getattr(module, attribute)


def build_model(reference: str):
    """The nn.Module that ``package.module:factory`` returns; GradbridgeError in one line otherwise."""
    import torch

    factory = load_factory(reference)
    try:
        module = factory()
    except Exception as ex:  # the user's code: any error, reported in one line
        raise GradbridgeError(f"model {reference!r}: the factory raised {type(ex).__name__}: {ex}") from ex
    if not isinstance(module, torch.nn.Module):
        raise GradbridgeError(f"model {reference!r}: the factory must return a torch.nn.Module, "
                              f"got {type(module).__name__}")
    return module


def _value(text: str) -> Any:
    """A CLI option value: int, float, true/false, a |-separated list, else the text."""
    if "|" in text:
        return [_value(v) for v in text.split("|") if v]
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _options(text: str, what: str) -> Dict[str, Any]:
    """``k=v,k=v`` -> dict (values through ``_value``)."""
    options: Dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise GradbridgeError(f"{what}: expected KEY=VALUE, got {item!r}")
        options[key.strip()] = _value(value.strip())
    return options


def _group(text: str) -> Dict[str, Any]:
    """``--group PREFIX:lr=1e-4,weight_decay=0`` -> a prefix group of the optimizer spec."""
    prefix, sep, rest = text.partition(":")
    if not sep or not prefix:
        raise GradbridgeError(f"--group {text!r}: expected PREFIX:KEY=VALUE[,KEY=VALUE...]")
    return {"prefix": prefix, **_options(rest, f"--group {text!r}")}


def _scheduler(specs: List[str], milestones: Optional[List[int]]) -> Optional[Dict[str, Any]]:
    """``--scheduler NAME:k=v,...`` (repeat it with --milestones for a SequentialLR)."""
    if not specs:
        if milestones is not None:
            raise GradbridgeError("--milestones needs --scheduler (two or more, for a SequentialLR)")
        return None
    parsed = []
    for text in specs:
        name, _, rest = text.partition(":")
        parsed.append({"name": name, **_options(rest, f"--scheduler {text!r}")})
    if len(parsed) == 1 and milestones is None:
        return parsed[0]
    if milestones is None:
        raise GradbridgeError("several --scheduler options need --milestones (a SequentialLR)")
    return {"name": "sequential", "schedulers": parsed, "milestones": milestones}


def _fine_tuning(*, freeze, accumulate, schedulers: Sequence[str], milestones, scheduler_interval, clip_norm,
                 clip_norm_type, clip_value, init_weights) -> Dict[str, Any]:
    # an option that only modifies another is refused alone rather than silently ignored
    if scheduler_interval is not None and not schedulers:
        raise GradbridgeError("--scheduler-interval needs --scheduler")
    if clip_norm_type is not None and clip_norm is None:
        raise GradbridgeError("--clip-norm-type needs --clip-norm")
    options: Dict[str, Any] = {"freeze": freeze or (), "accumulate": accumulate,
                               "scheduler": _scheduler(list(schedulers), milestones),
                               "scheduler_interval": scheduler_interval or "step",
                               "clip_grad_norm": clip_norm,
                               "clip_norm_type": 2.0 if clip_norm_type is None else clip_norm_type,
                               "clip_grad_value": clip_value, "init_weights": init_weights}
    return options


def export_from_options(model: str, output: str | os.PathLike, *, seed: int, optimizer: Dict[str, Any],
                        groups: Sequence[str] = (), loss_name: Optional[str] = None, loss: Dict[str, Any] | None = None,
                        input_shape: Optional[List[int]] = None, input_dtype: str = "float32",
                        target_shape: Optional[List[int]] = None, target_dtype: Optional[str] = None,
                        freeze=None, accumulate: int = 1, schedulers: Sequence[str] = (),
                        milestones: Optional[List[int]] = None, scheduler_interval: Optional[str] = None,
                        clip_norm: Optional[float] = None, clip_norm_type: Optional[float] = None,
                        clip_value: Optional[float] = None, init_weights=None,
                        op_libraries: Sequence[str | os.PathLike] = (), check: bool = True,
                        format: str = protocol.DEFAULT_FORMAT, autocast: Optional[str] = None) -> Path:
    """Export ``model`` to ``output`` as `gradbridge export` does; returns the written path.

    ``optimizer``: the optimizer spec (name and the options given); ``groups``: ``PREFIX:KEY=VALUE,...``
    texts; ``loss_name`` (default mse) and ``loss``: the loss options given (``class_weights`` is
    torch's ``weight``); ``schedulers``: ``NAME:KEY=VALUE,...`` texts (several with ``milestones``:
    a SequentialLR); ``check``: the export's check against the eager model (``--no-check``); ``format``:
    ``--format``; ``autocast``: ``--autocast``, a dtype's name (``bfloat16``, ``float16``) for
    ``export_training_module``'s ``autocast=``; the rest are the fine-tuning options under their CLI names.
    """
    import torch

    from .._runtime import ops
    from . import export_builtin, export_training_module
    from .training_module import example_batch

    check_writable(output)
    ops.load(op_libraries)  # the model's custom operators must exist to script it
    optimizer = dict(optimizer)
    if groups:
        optimizer["groups"] = [_group(text) for text in groups]
    fine_tuning = _fine_tuning(freeze=freeze, accumulate=accumulate, schedulers=schedulers, milestones=milestones,
                               scheduler_interval=scheduler_interval, clip_norm=clip_norm,
                               clip_norm_type=clip_norm_type, clip_value=clip_value, init_weights=init_weights)
    fine_tuning["check"] = check
    fine_tuning["format"] = format
    if autocast is not None:
        fine_tuning["autocast"] = getattr(torch, autocast)
    loss = {"name": loss_name or "mse", **(loss or {})}
    if "class_weights" in loss:
        loss["weight"] = loss.pop("class_weights")
    if model == "linear-regression" and loss_name is None and input_shape is None:
        return export_builtin(model, output, seed=seed, optimizer=optimizer, fine_tuning=fine_tuning)

    x_shape = input_shape or [1]
    y_dtype = target_dtype or ("int64" if loss["name"] in CLASS_TARGET_LOSSES else "float32")
    y_shape = target_shape if target_shape is not None else (
        [] if loss["name"] in CLASS_TARGET_LOSSES else [1])
    inputs = [protocol.tensor_spec("x", [-1, *x_shape], input_dtype),
              protocol.tensor_spec("y", [-1, *y_shape], y_dtype)]
    if model in BUILTIN_MODELS:
        return export_builtin(model, output, seed=seed, optimizer=optimizer, loss=loss, inputs=inputs,
                              fine_tuning=fine_tuning, **_builtin_sizes(model, x_shape, y_shape, loss["name"]))
    torch.manual_seed(seed)
    module = build_model(model)
    # A batch of the declared shapes: checks model and loss fit, allows tracing, and the export's check runs on it.
    example = example_batch(inputs)
    return export_training_module(module, loss, optimizer, output, example_inputs=example,
                                  model_name=model, **fine_tuning)


def _builtin_sizes(name: str, x_shape: List[int], y_shape: List[int], loss: str) -> Dict[str, int]:
    """A built-in model sized by --input-shape (and, for a regression loss, --target-shape)."""
    if name == "linear-regression":
        if x_shape != [1] or y_shape not in ([1], []):
            raise GradbridgeError(f"model linear-regression takes --input-shape 1 and --target-shape 1, got "
                                  f"{','.join(map(str, x_shape))} and {','.join(map(str, y_shape)) or 'none'}")
        return {}
    regression = loss not in CLASS_TARGET_LOSSES and len(y_shape) == 1
    if name == "small-cnn":
        if len(x_shape) != 3 or x_shape[0] != 1 or x_shape[1] != x_shape[2]:
            raise GradbridgeError(f"model small-cnn takes --input-shape 1,SIDE,SIDE, got {','.join(map(str, x_shape))}")
        return {"side": x_shape[1], **({"classes": y_shape[0]} if regression else {})}
    if len(x_shape) != 1:
        raise GradbridgeError(f"model {name} takes --input-shape FEATURES (one number), got {','.join(map(str, x_shape))}")
    if name == "shared-weights":
        return {"features": x_shape[0], **({"classes": y_shape[0]} if regression else {})}
    return {"in_features": x_shape[0], **({"out_features": y_shape[0]} if regression else {})}
