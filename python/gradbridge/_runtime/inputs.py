"""A model's inputs: one tensor ``x``, or several tensors by name.

A training module's model takes either one tensor, ``x`` (every module exported before several inputs,
and still the common case), or several tensors that it receives by keyword (``input_ids`` and
``attention_mask``; a recommender's ``user``, ``item`` and ``context``). The metadata's ``inputs`` lists
the model's inputs in order, then the target ``y``. The scripted methods take one Tensor where the model
has one input and a list of tensors in that order where it has several (Java:
``dev.gradbridge.Inputs``); data files hold one array per input, named as in the metadata.

In Python a batch's inputs are a Tensor (or numpy array) for a one-input model and a dict name -> tensor
for the others; the functions here take either.
"""

from __future__ import annotations

import inspect
import keyword
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor, nn

from .. import messages

X = "x"
Y = "y"

Batch = Union[Tensor, Dict[str, Tensor]]


def names(metadata: Mapping[str, Any]) -> List[str]:
    """The model's input names, in order (the metadata's ``inputs`` without the target ``y``)."""
    return [spec["name"] for spec in metadata["inputs"][:-1]]


def is_single(input_names: Sequence[str]) -> bool:
    """One input named ``x``: the methods take a Tensor, not a list."""
    return list(input_names) == [X]


def call(model: nn.Module, x: Batch) -> Any:
    """The eager model on one batch's inputs: ``model(x)``, or ``model(**x)`` for named inputs."""
    return model(x) if isinstance(x, Tensor) else model(**x)


def method_argument(x: Batch, input_names: Sequence[str]) -> Union[Tensor, List[Tensor]]:
    """What a scripted method takes for ``x``: the tensor, or the named tensors in metadata order."""
    if is_single(input_names):
        return x if isinstance(x, Tensor) else x[X]
    return [x[name] for name in input_names]


def select(x: Batch, index: Tensor) -> Batch:
    """``index_select(0, index)`` of every input."""
    return x.index_select(0, index) if isinstance(x, Tensor) else {n: t.index_select(0, index) for n, t in x.items()}


def split(x: Batch, size: int) -> List[Batch]:
    """``split(size)`` of every input: the micro-batches of gradient accumulation."""
    if isinstance(x, Tensor):
        return list(x.split(size))
    parts = {name: t.split(size) for name, t in x.items()}
    return [{name: part[i] for name, part in parts.items()} for i in range(len(next(iter(parts.values()))))]


def to_torch(x: Any) -> Batch:
    """numpy array(s) as tensors sharing their memory (made contiguous first)."""
    if isinstance(x, Mapping):
        return {name: to_torch(value) for name, value in x.items()}
    return x if isinstance(x, Tensor) else torch.from_numpy(np.ascontiguousarray(x))


def arrays(x: Any) -> Dict[str, Any]:
    """Every input by name: ``{"x": x}`` for one tensor or array."""
    return dict(x) if isinstance(x, Mapping) else {X: x}


def of_example(model: nn.Module, x: Any) -> Tuple[List[str], Batch]:
    """The input names and the inputs of an example batch given as a tensor, a tuple or list of
    tensors (named after the model's ``forward`` parameters) or a dict; checked against ``forward``."""
    if isinstance(x, Tensor):
        return [X], x
    if isinstance(x, (tuple, list)):
        params = _positional_parameters(model)
        if params is None or len(params) < len(x):
            raise ValueError(messages.inputs_unnamed(type(model).__name__, len(x)))
        x = dict(zip(params, x))
    if not isinstance(x, Mapping) or not x:
        raise ValueError(messages.inputs_kind(type(x).__name__))
    for name, value in x.items():
        if not isinstance(value, Tensor):
            raise ValueError(messages.input_not_tensor(name, type(value).__name__))
    input_names = list(x)
    check_names(model, input_names)
    return input_names, (x[X] if is_single(input_names) else dict(x))


def check_names(model: nn.Module, input_names: Sequence[str]) -> None:
    """Names a generated ``model(name=...)`` call can use, and that ``forward`` takes."""
    for name in input_names:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name == Y:
            raise ValueError(messages.input_name(name))
    if len(set(input_names)) != len(input_names):
        raise ValueError(messages.input_name_twice(input_names))
    if is_single(input_names):
        return
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return  # a forward Python cannot inspect: the capture finds out
    kinds = {p.name: p.kind for p in signature.parameters.values()}
    if inspect.Parameter.VAR_KEYWORD in kinds.values():
        return
    takes = [n for n, k in kinds.items() if k not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY)]
    for name in input_names:
        if name not in takes:
            raise ValueError(messages.input_not_a_parameter(type(model).__name__, name, takes))


def _positional_parameters(model: nn.Module) -> List[str] | None:
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_OR_KEYWORD,)
    return [p.name for p in parameters if p.kind in positional]
