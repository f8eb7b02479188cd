"""An op list against this torch's schemas, the native layer's checks at load (``check``: every operator exists,
takes as many arguments as given, each of a kind its schema type reads, a slot holding what it takes, and
returns as many values) and before each op runs (``check_sizes``: what its arguments size from the file).
The file has passed ``oplist_check`` (the op list as data) first.
"""

from __future__ import annotations

from typing import Any, List, Mapping

import torch

from . import oplist_check
from ..errors import OpListError

ITEM = oplist_check.ITEM


def overload(op: str, overload_name: str, where: str = "op list") -> Any:
    """The torch operator ``op.overload_name`` (``aten::add``, ``Tensor``), or OpListError naming it."""
    try:
        namespace, name = op.split("::", 1)
        return getattr(getattr(getattr(torch.ops, namespace), name), overload_name)
    except (AttributeError, RuntimeError, ValueError) as ex:
        raise OpListError(f"{where}: unknown operator {op}.{overload_name}") from ex


def check(graph: Mapping[str, Any], where: str) -> None:
    """What the native layer checks when it loads an op list, without running it: the op list as data
    (``oplist_check.check_graph``: version, allow-list, argument kinds, slots, limits), then against this
    torch's schemas: every operator exists, takes as many arguments as given, each of a kind its schema type
    reads (a slot holding what it takes), and returns as many values; every output a tensor."""
    oplist_check.check_graph(graph, where)
    slots = ["double" if name.startswith("scalar:") else "tensor" for name in graph["inputs"]]
    for k, node in enumerate(graph["nodes"]):
        at = f"{where} node {k} ({oplist_check.shown(oplist_check.node_name(node['op'], node['overload']))})"
        schema = None if node["op"] == ITEM else overload(node["op"], node["overload"], where)._schema
        for j, arg in enumerate(node["args"]):
            for s in (arg or {}).get("tl", []) + [v for v in (arg or {}).get("otl", []) if v is not None]:
                if slots[s] != "tensor":
                    raise OpListError(f"{at} args[{j}]: slot {s} holds {_SLOT_NAMES[slots[s]]}, not a tensor")
        if node["op"] == ITEM:
            if slots[node["args"][0]["t"]] != "list":
                raise OpListError(f"{at}: takes a list slot and an index and has one output")
            slots.append("tensor")
            continue
        if len(node["args"]) != len(schema.arguments):
            raise OpListError(f"{at}: {len(node['args'])} arguments, its schema takes {len(schema.arguments)}")
        for j, (arg, argument) in enumerate(zip(node["args"], schema.arguments)):
            if not _fits(arg, argument.real_type, slots):
                given = f"slot {arg['t']} ({_SLOT_NAMES[slots[arg['t']]]})" if arg and "t" in arg else \
                    "an argument of another kind"
                raise OpListError(f"{at} args[{j}]: {given} where its schema takes {_type_text(argument.real_type)} "
                                  f"{argument.name}")
        if node["outputs"] != len(schema.returns):
            raise OpListError(f"{at}: {node['outputs']} outputs, it returns {len(schema.returns)}")
        slots += [_slot_of(r.type) for r in schema.returns] or ["none"]
    for out in graph["outputs"]:
        if slots[out["ref"]] != "tensor":
            raise OpListError(f"{where}: an output refers to slot {out['ref']}, which holds {_SLOT_NAMES[slots[out['ref']]]}, "
                              "not a tensor")


_SLOT_NAMES = {"tensor": "a tensor", "double": "a double", "list": "a list", "none": "no value"}


def _slot_of(type_: Any) -> str:
    kind = type_.kind()
    return "tensor" if kind == "TensorType" else "list" if kind == "ListType" else "none"


def _type_text(type_: Any) -> str:
    """A schema type as libtorch's ``str()`` writes it (``int[]``, ``Tensor?``), as the native layer's lines say."""
    kind = type_.kind()
    if kind == "OptionalType":
        return f"{_type_text(type_.getElementType())}?"
    if kind == "ListType":
        return f"{_type_text(type_.getElementType())}[]"
    return "Scalar" if kind == "NumberType" else str(type_)


def _fits(arg: Any, type_: Any, slots: List[str]) -> bool:
    """Whether argument ``arg`` fits schema type ``type_`` (its real type) as the boxed kernel reads it: the native
    layer's ``fits``. A number given for a Tensor is a wrapped number, an int for a float that double."""
    kind = type_.kind()
    if kind == "OptionalType":
        if arg is None:
            return True
        type_, kind = type_.getElementType(), type_.getElementType().kind()
    given = next(iter(arg)) if arg else None
    slot = slots[arg["t"]] if given == "t" else None
    if kind == "TensorType":
        return slot == "tensor" or given in ("i", "f", "b")
    if kind == "ListType":
        element = type_.getElementType()
        inner = element.kind()
        if inner == "TensorType":
            return given == "tl" or slot == "list"
        if inner == "OptionalType":
            return element.getElementType().kind() == "TensorType" and (given == "otl" or slot == "list")
        return {"IntType": ("il", "sl"), "SymIntType": ("il", "sl"), "FloatType": ("fl",), "BoolType": ("bl",)
                }.get(inner, ()).__contains__(given)
    if kind in ("IntType", "SymIntType"):
        return given in ("i", "bx")
    if kind == "FloatType":
        return given in ("f", "i") or slot == "double"
    if kind == "NumberType":
        return given in ("i", "f", "b", "bx") or slot == "double"
    return given == {"BoolType": "b", "StringType": "s", "ScalarTypeType": "dtype", "LayoutType": "layout",
                     "DeviceObjType": "device", "MemoryFormatType": "mf"}.get(kind, "-")


def check_sizes(schema: Any, args: List[Any], where: str) -> None:
    """Before an op runs, what its arguments size from the file (the native layer's check_sizes): each argument
    named in ``oplist_check.SIZED`` holds sizes of at least -1 whose product is at most ``elements``; an op that
    takes a ``size`` and a ``stride`` (as_strided's kind) stays within its source's storage."""
    limit = oplist_check.LIMITS["elements"]
    for argument, value in zip(schema.arguments, args):
        if argument.name not in oplist_check.SIZED or not isinstance(value, (int, list)):
            continue
        sizes = [value] if isinstance(value, int) else value
        product = 1
        for d in sizes:
            if d < -1 or (isinstance(value, int) and d < 0):
                raise OpListError(f"{where}: {argument.name} {sizes} holds a negative size")
            product *= max(d, 1)
            if product > limit:
                raise OpListError(f"{where}: {argument.name} {sizes} sizes more than the limit of {limit} elements")
    named = {a.name: v for a, v in zip(schema.arguments, args)}
    source = next((v for v in args if isinstance(v, torch.Tensor)), None)
    if "stride" not in named or "size" not in named or source is None:  # as_strided's kind (not a convolution's stride)
        return
    size, stride, offset = named.get("size") or [], named["stride"] or [], named.get("storage_offset") or 0
    storage = source.untyped_storage().nbytes() // max(source.element_size(), 1)
    empty = 0 in size
    reach = offset + sum((s - 1) * t for s, t in zip(size, stride)) if not empty else offset
    fits = len(size) == len(stride) and offset >= 0 and all(s >= 0 and t >= 0 for s, t in zip(size, stride))
    if not fits or (not empty and reach >= storage) or reach >= 2 ** 63:
        raise OpListError(f"{where}: size {size}, stride {stride} and offset {offset} reach past its source's "
                          f"{storage} elements")
