"""A protocol-3 file read as data: the checks every part of it passes before anything runs, one line naming
what is wrong. Java's twin is ``dev.gradbridge.ProgramCheck`` (it hands the native layer only what passed);
the two classify the files of tests/vectors/protocol3/ alike (tests/test_faults_protocol3.py).

The rules (``oplist_rules.json``, one file for both readers): the op-list version, the limits, and the
operator allow-list (``op.overload`` of each operator gradbridge's capture emits). JSON is read strictly
(RFC 8259: no NaN or Infinity, no duplicate keys, nesting and size bounded); an integer is a JSON integer
in int64's range, a flag a JSON ``true``/``false``, a double of the op lists ``float.hex`` text; every
optimizer and schedule field in the range torch accepts, so no step divides by zero or overflows.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from ..errors import OpListError

#: The kinds of an op-list argument (``oplist``'s docstring says what each holds).
ARG_KINDS = ("t", "tl", "otl", "i", "f", "b", "il", "sl", "bx", "fl", "bl", "s", "dtype", "layout", "device", "mf")

RULES: Dict[str, Any] = json.loads(Path(__file__).with_name("oplist_rules.json").read_text(encoding="utf-8"))
VERSION: int = RULES["oplist_version"]
LIMITS: Dict[str, int] = RULES["limits"]
OPERATORS = frozenset(RULES["operators"])
SIZED = tuple(RULES["sized_arguments"])
ITEM = "#item"
INT64 = (-(2 ** 63), 2 ** 63 - 1)
#: ``float.hex`` text as Python and C's ``%a`` write it
_HEX = re.compile(r"-?(0x[0-9a-f]+(\.[0-9a-f]*)?p[+-]?[0-9]{1,6}|inf|nan)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
BINDING_PREFIXES = ("param:", "buffer:", "grad:", "const:", "state:", "input:", "scalar:")
BINDINGS = ("target", "output", "loss")
GRAPH_KEYS = ("oplist_version", "inputs", "nodes", "outputs")
NODE_KEYS = ("op", "overload", "args", "outputs")
#: argument kinds whose value is a list, and what each element is
_LIST_KINDS = {"tl": "int", "otl": "int?", "il": "int", "fl": "hex", "bl": "bool", "sl": "size"}
DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool", "bfloat16")
MEMORY_FORMATS = ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")
OPTIMIZER_FIELDS = {  # per optimizer: each group's fields (number: >= 0 unless named in SIGNED)
    "sgd": {"lr": "number", "momentum": "number", "dampening": "number", "weight_decay": "number",
            "nesterov": "bool", "maximize": "bool"},
    "adam": {"lr": "number", "betas": "betas", "eps": "number", "weight_decay": "number", "amsgrad": "bool",
             "maximize": "bool"},
    "rmsprop": {"lr": "number", "alpha": "number", "eps": "number", "weight_decay": "number", "momentum": "number",
                "centered": "bool", "maximize": "bool"},
    "adagrad": {"lr": "number", "lr_decay": "number", "weight_decay": "number", "initial_accumulator_value": "number",
                "eps": "number", "maximize": "bool"},
}
OPTIMIZER_FIELDS["adamw"] = OPTIMIZER_FIELDS["adam"]
SIGNED = ("dampening",)
INTERVALS = ("step", "epoch", "none")
RESTARTABLE = ("step", "multistep", "exponential", "cosine", "linear")  # a SequentialLR's children


def shown(value: Any) -> str:
    """A value of the file as a line shows it: JSON text, cut at ``shown_chars`` (a 1 MB name is not echoed)."""
    text = value if isinstance(value, str) else json.dumps(value)
    limit = LIMITS["shown_chars"]
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def fail(where: str, what: str) -> None:
    raise OpListError(f"{where}: {what}")


# ---- strict JSON ----

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: List[Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {shown(key)}")
        out[key] = value
    return out


def load_json(data: bytes, where: str) -> Any:
    """RFC 8259 JSON of at most ``json_bytes`` bytes nested at most ``json_depth`` deep (counted without
    recursion: a 1,000,000-deep text is one line, not a RecursionError)."""
    if len(data) > LIMITS["json_bytes"]:
        fail(where, f"{len(data)} bytes of JSON, more than the limit of {LIMITS['json_bytes']}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        fail(where, "invalid JSON (not UTF-8)")
    depth = deepest = 0
    for bracket in re.findall(r"[\[\]{}]", _STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > LIMITS["json_depth"]:
        fail(where, f"invalid JSON (nesting deeper than {LIMITS['json_depth']})")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except ValueError as ex:  # JSONDecodeError too
        fail(where, f"invalid JSON ({str(ex).splitlines()[0]})")


# ---- typed values ----

def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and INT64[0] <= value <= INT64[1]


def integer(value: Any, where: str, field: str, low: int = INT64[0], high: int = INT64[1]) -> int:
    if not is_int(value):
        fail(where, f"{field} is {shown(value)}, expected an integer")
    if not low <= value <= high:
        fail(where, f"{field} is {value}, expected {_range(low, high)}")
    return value


def _range(low: Any, high: Any) -> str:
    return f"{low} to {high}" if high != INT64[1] else f"{low} or more"


def flag(value: Any, where: str, field: str) -> bool:
    if not isinstance(value, bool):
        fail(where, f"{field} is {shown(value)}, expected true or false")
    return value


def text(value: Any, where: str, field: str) -> str:
    if not isinstance(value, str):
        fail(where, f"{field} is {shown(value)}, expected a string")
    if len(value) > LIMITS["name_chars"]:
        fail(where, f"{field} is {shown(value)}, longer than the limit of {LIMITS['name_chars']} characters")
    return value


def array(value: Any, where: str, field: str) -> List[Any]:
    if not isinstance(value, list):
        fail(where, f"{field} is {shown(value)}, expected a list")
    return value


def member(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        fail(where, f"lacks '{key}'")
    return obj[key]


def hex_double(value: Any, where: str, field: str) -> float:
    """A double as ``float.hex`` text (exact; inf and nan too)."""
    if not isinstance(value, str) or _HEX.fullmatch(value) is None:
        fail(where, f"{field} is {shown(value)}, expected a double as float.hex text")
    try:
        return float.fromhex(value)
    except OverflowError:
        fail(where, f"{field} is {shown(value)}, beyond a double's range")


def number(value: Any, where: str, field: str, low: float = -math.inf, high: float = math.inf,
           below_high: bool = False, above_low: bool = False) -> float:
    """A finite JSON number (integer or not) in [low, high] (``below_high``: high excluded; ``above_low``:
    low excluded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(where, f"{field} is {shown(value)}, expected a number")
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        fail(where, f"{field} is {shown(value)}, expected a finite number")
    if x < low or x > high or (below_high and x == high) or (above_low and x == low):
        left, right = "(" if above_low else "[", ")" if below_high else "]"
        fail(where, f"{field} is {shown(value)}, expected a number in {left}{_bound(low)}, {_bound(high)}{right}")
    return x


def _bound(x: float) -> str:
    return "inf" if x == math.inf else "-inf" if x == -math.inf else repr(x)


def finite_hex(value: Any, where: str, field: str, low: float = -math.inf) -> float:
    x = hex_double(value, where, field)
    if not math.isfinite(x) or x < low:
        fail(where, f"{field} is {shown(value)}, expected a finite double{'' if low == -math.inf else f' >= {low!r}'}")
    return x


def is_binding(name: str) -> bool:
    return name in BINDINGS or name.startswith(BINDING_PREFIXES)


def binding(value: Any, where: str, field: str) -> str:
    name = text(value, where, field)
    if not is_binding(name):
        fail(where, f"{field} is {shown(name)}, not a binding (param:, buffer:, grad:, const:, state:, input:, "
                    "scalar:, target, output or loss)")
    return name


# ---- op lists ----

def check_graph(graph: Any, where: str) -> None:
    """An op list as data: its version, keys, bindings, every node's operator on the allow-list, every argument
    of a known kind holding a value of its type, every slot it refers to computed before it, the limits."""
    if not isinstance(graph, dict) or not is_int(graph.get("oplist_version")) or graph["oplist_version"] != VERSION:
        version = graph.get("oplist_version") if isinstance(graph, dict) else None
        fail(where, f"op-list version {shown(json.dumps(version))}, this gradbridge runs version {VERSION}")
    for key in graph:
        if key not in GRAPH_KEYS:
            fail(where, f"unknown key {shown(key)}")
    inputs = array(member(graph, "inputs", where), where, "inputs")
    for k, name in enumerate(inputs):
        binding(name, where, f"inputs[{k}]")
    nodes = array(member(graph, "nodes", where), where, "nodes")
    if len(nodes) > LIMITS["nodes"]:
        fail(where, f"{len(nodes)} nodes, more than the limit of {LIMITS['nodes']}")
    slots = len(inputs)
    for k, node in enumerate(nodes):
        slots += check_node(node, slots, f"{where} node {k}")
    for k, out in enumerate(array(member(graph, "outputs", where), where, "outputs")):
        at = f"{where} outputs[{k}]"
        if not isinstance(out, dict) or set(out) != {"ref", "to"}:
            fail(at, f"{shown(out)} is not an object of 'ref' and 'to'")
        integer(out["ref"], at, "ref", 0, slots - 1)
        binding(out["to"], at, "to")


def operator_name(op: str, overload: str) -> str:
    """``op.overload`` as the allow-list names it (``aten::add.Tensor``, ``aten::relu.default``)."""
    return f"{op}.{overload}"


def node_name(op: str, overload: str) -> str:
    """A node as the lines name it, the native layer's way (``#item``: no overload)."""
    return op if overload == "" else f"{op}.{overload}"


def check_node(node: Any, slots: int, where: str) -> int:
    """One node (``slots``: how many are computed before it); returns how many slots it adds."""
    if not isinstance(node, dict):
        fail(where, f"{shown(node)} is not an object")
    for key in NODE_KEYS:
        member(node, key, where)
    for key in node:
        if key not in NODE_KEYS:
            fail(where, f"unknown key {shown(key)}")
    op = text(node["op"], where, "op")
    overload = text(node["overload"], where, "overload")
    args = array(node["args"], where, "args")
    if op == ITEM:
        if overload != "" or len(args) != 2 or not is_int(node["outputs"]) or node["outputs"] != 1 \
                or not isinstance(args[0], dict) \
                or set(args[0]) != {"t"} or not isinstance(args[1], dict) or set(args[1]) != {"i"}:
            fail(where, f"{ITEM} takes a list slot and an index ({{\"t\": n}}, {{\"i\": k}}) and has one output")
    elif operator_name(op, overload) not in OPERATORS:
        fail(where, f"operator {shown(operator_name(op, overload))} is not on protocol 3's operator allow-list")
    outputs = integer(node["outputs"], where, "outputs", 0, 64)
    for k, arg in enumerate(args):
        check_arg(arg, slots, f"{where} ({shown(operator_name(op, overload))}) args[{k}]")
    return max(outputs, 1)


def check_arg(arg: Any, slots: int, where: str) -> None:
    if arg is None:
        return
    if not isinstance(arg, dict) or len(arg) != 1:
        fail(where, f"{shown(arg)} is not null or an object of one kind")
    (kind, value), = arg.items()
    if kind not in ARG_KINDS:
        fail(where, f"unknown argument kind '{shown(kind)}'")
    if kind == "t":
        integer(value, where, "t", 0, slots - 1)
    elif kind in ("i", "b", "f", "s", "bx", "dtype", "layout", "device", "mf"):
        _scalar_arg(kind, value, where)
    else:
        element = _LIST_KINDS[kind]
        for k, item in enumerate(array(value, where, kind)):
            field = f"{kind}[{k}]"
            if element == "int" and kind == "il":
                integer(item, where, field)
            elif element in ("int", "int?"):
                if item is not None or element == "int":
                    integer(item, where, field, 0, slots - 1)
            elif element == "hex":
                hex_double(item, where, field)
            elif element == "bool":
                flag(item, where, field)
            elif is_int(item):
                pass
            elif isinstance(item, dict) and set(item) == {"bx"}:
                _scalar_arg("bx", item["bx"], where)
            else:
                fail(where, f"{field} is {shown(item)}, expected an integer or {{\"bx\": [a, c]}}")


def _scalar_arg(kind: str, value: Any, where: str) -> None:
    if kind == "i":
        integer(value, where, kind)
    elif kind == "b":
        flag(value, where, kind)
    elif kind == "f":
        hex_double(value, where, kind)
    elif kind == "s":
        text(value, where, kind)
    elif kind == "bx":
        if not isinstance(value, list) or len(value) != 2:
            fail(where, f"bx is {shown(value)}, expected [a, c]")
        integer(value[0], where, "bx[0]")
        integer(value[1], where, "bx[1]")
    else:
        known = {"dtype": DTYPES, "layout": ("strided",), "device": ("cpu",), "mf": MEMORY_FORMATS}[kind]
        if value not in known:
            fail(where, f"{kind} is {shown(value)}, expected one of {', '.join(known)}")


#: The graphs a program may hold (``NAME@1``: captured at one sample, for the first four), the binding each
#: one's outputs must hold, and the graphs every program holds (``program``'s docstring)
GRAPH_OUTPUTS = {"train": "loss", "train_accumulate": "loss", "forward": "output", "loss": "loss", "clip": None,
                 "optimizer": None, "optimizer_first": None}
ONE_SAMPLE = ("train", "train_accumulate", "forward", "loss")
REQUIRED_GRAPHS = ("train", "forward", "loss", "optimizer")


def check_role(name: str, graph: Mapping[str, Any], where: str) -> None:
    """A graph's name is one a program holds, and its outputs hold the binding its method reads."""
    base = name[:-2] if name.endswith("@1") else name
    if base not in GRAPH_OUTPUTS or (base != name and base not in ONE_SAMPLE):
        fail(where, f"unknown graph (a program holds {', '.join(GRAPH_OUTPUTS)})")
    wanted = GRAPH_OUTPUTS[base]
    if wanted is not None and all(out["to"] != wanted for out in graph["outputs"]):
        fail(where, f"outputs no {wanted}")


def check_required(names: Any, where: str) -> None:
    for name in REQUIRED_GRAPHS:
        if name not in names:
            fail(where, f"lacks graph {name}")
