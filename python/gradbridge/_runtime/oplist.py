"""gradbridge's op list: one aten graph as JSON that the native layer runs op by op (protocol 3).

Not torch's ExportedProgram schema (it moves with torch): a small format of gradbridge's own, versioned by
``VERSION``. A graph is::

    {"oplist_version": 4,
     "inputs": ["param:fc.weight", "input:x", "target", "scalar:neg_lr:0", ...],   # slots 0..k-1
     "nodes": [{"op": "aten::addmm", "overload": "default", "args": [ARG, ...], "outputs": 1}, ...],
     "outputs": [{"ref": SLOT, "to": "loss"}, {"ref": SLOT, "to": "grad:fc.weight"}, ...]}

Each node's results take the next slots (``outputs`` of them; an op returning a list takes one slot, and
``#item`` picks an element). ``args`` holds every argument of the op's schema, in schema order (defaults
filled in at export), each one of ``ARG_KINDS``: ``{"t": slot}`` a value, ``{"tl": [slots]}`` a tensor
list, ``{"otl": [slot | null]}`` a list of optional tensors, ``null`` None, ``{"i": n}``, ``{"f": hex}``
(``float.hex``: exact, and inf/nan), ``{"b": bool}``, ``{"il": [n]}``, ``{"sl": [n | {"bx": [a, c]}]}`` an
int list whose ``bx`` elements are ``a * batch + c``, ``{"bx": [a, c]}`` an int so computed, ``{"fl":
[hex]}``, ``{"bl": [bool]}``, ``{"s": text}``, ``{"dtype": name}``, ``{"layout": name}``, ``{"device":
name}``, ``{"mf": name}``. ``batch`` is the first dimension of the call's first ``input:`` binding (else of
``target``). A number (``i``, ``f``, ``b``) given for a ``Tensor`` argument is a wrapped number, as Python's
argument parser makes it (``aten::div.Tensor(loss, 2)`` of ``loss / 2``). Binding
names (inputs and outputs): ``param:NAME``, ``buffer:NAME``, ``grad:NAME``, ``const:NAME``,
``state:KEY:NAME`` (optimizer state), ``input:NAME``, ``target``, ``scalar:NAME:G`` (a double the host
computes per step for parameter group G by the optimizer's formula, ``program.host_scalars``), ``loss``,
``output``.

Version rule: any change a reader of the previous version would misread (a binding, an argument kind,
what the program around the op lists means) bumps ``VERSION``; readers refuse any other version in one
line. Version 2: host scalars per parameter group (``scalar:NAME:G``), and the program's ``training`` and
``counters`` (accumulation, clipping, schedules, frozen parameters, checkpoints). Version 3: SGD's and
RMSprop's ``momentum`` is a host scalar (``scalar:momentum:G``, read by the step graph even at momentum 0)
and the counters hold OneCycleLR's cycled ``momenta``. Version 4: a joint graph's forward (its nodes up to
the one that computes ``loss``, ``forward_ops``) runs with grad mode on, as eager's forward. The native layer's ``kOpListVersion`` and Java's
``Protocol.OPLIST_VERSION`` equal ``VERSION`` (tests/test_pins.py).

``run`` is the Python twin of the native interpreter (native/oplist_graph.cpp), used by the
export's bitwise check before anything is written.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import torch

from . import oplist_types  # noqa: E402
from .oplist_check import ARG_KINDS, VERSION  # noqa: E402,F401  (oplist_rules.json holds it, with the allow-list)
#: Argument kinds (the keys of an argument object); the native interpreter refuses any other.
#: Interpreter built-ins (not aten ops): ``#item`` takes element ``i`` of a list value.
ITEM = "#item"
#: Ops dropped at export: checks of tensor metadata that compute nothing.
DROPPED = ("aten::_assert_tensor_metadata",)

DTYPES = {"uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
          "int64": torch.int64, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
          "bool": torch.bool, "bfloat16": torch.bfloat16}
LAYOUTS = {"strided": torch.strided}
MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "preserve_format": torch.preserve_format,
                  "channels_last": torch.channels_last, "channels_last_3d": torch.channels_last_3d}


from ..errors import OpListError  # noqa: E402  (re-exported: oplist.OpListError)


def _name(value: Any, table: Mapping[str, Any], kind: str) -> str:
    for name, known in table.items():
        if known == value:
            return name
    raise OpListError(f"op list: unsupported {kind} {value}")


def _list_element(type_: Any) -> Any:
    """The element type of a list type (also under Optional: ``int[]?``), else None."""
    if isinstance(type_, torch._C.OptionalType):
        type_ = type_.getElementType()
    return type_.getElementType() if isinstance(type_, torch._C.ListType) else None


def _is_tensor(type_: Any) -> bool:
    return type_ is not None and type_.isSubtypeOf(torch._C.TensorType.get())


def encode_arg(value: Any, slot_of: Dict[Any, int], type_: Any) -> Any:
    """One argument of an FX node as an op-list argument (``slot_of`` maps FX nodes to slots; ``type_`` is
    the schema argument's type: ``Tensor?[]`` and ``Tensor[]`` tell the tensor-list kinds apart)."""
    import torch.fx as fx

    if isinstance(value, fx.Node):
        return {"t": slot_of[value]}
    if value is None:
        return None
    if isinstance(value, bool):
        return {"b": value}
    if isinstance(value, int):
        return {"i": value}
    if isinstance(value, float):
        return {"f": value.hex()}
    if isinstance(value, torch.dtype):
        return {"dtype": _name(value, DTYPES, "dtype")}
    if isinstance(value, torch.layout):
        return {"layout": _name(value, LAYOUTS, "layout")}
    if isinstance(value, torch.memory_format):
        return {"mf": _name(value, MEMORY_FORMATS, "memory format")}
    if isinstance(value, torch.device):
        if value.type != "cpu":
            raise OpListError(f"op list: device {value} (gradbridge runs on the CPU)")
        return {"device": "cpu"}
    if isinstance(value, str):
        return {"s": value}
    if isinstance(value, (list, tuple)):
        items = list(value)
        element = _list_element(type_)
        if isinstance(element, torch._C.OptionalType) and _is_tensor(element.getElementType()):
            return {"otl": [None if v is None else slot_of[v] for v in items]}
        if _is_tensor(element):
            return {"tl": [slot_of[v] for v in items]}
        if all(isinstance(v, bool) for v in items) and (element == torch._C.BoolType.get() or items):
            return {"bl": items}
        if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            return {"il": items}
        if all(isinstance(v, float) for v in items):
            return {"fl": [v.hex() for v in items]}
    raise OpListError(f"op list: unsupported argument {value!r} of type {type_}")


def _fresh_mask(node: Any) -> bool:
    """``bernoulli.p`` drawn into an ``empty_like`` that nothing else reads: eager's in-place draw."""
    source = node.args[0] if node.target is torch.ops.aten.bernoulli.p else None
    return (getattr(source, "target", None) is torch.ops.aten.empty_like.default and len(source.users) == 1
            and source.kwargs.get("memory_format") in (None, torch.preserve_format))


def from_fx(graph: Any, inputs: Sequence[str], outputs: Sequence[str]) -> Dict[str, Any]:
    """An FX graph (placeholders in ``inputs``' order, an output tuple in ``outputs``' order; an output
    binding ``None`` drops that output) as an op list."""
    import operator

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise OpListError(f"op list: the graph takes {len(placeholders)} inputs, {len(inputs)} bindings given")
    slot_of: Dict[Any, int] = {n: i for i, n in enumerate(placeholders)}
    list_results = set()
    nodes: List[Dict[str, Any]] = []
    next_slot = len(placeholders)
    result = None
    for node in graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            result = node.args[0]
            continue
        if node.op == "get_attr":
            raise OpListError(f"op list: graph attribute {node.target} (constants are lifted to state)")
        if node.op != "call_function":
            raise OpListError(f"op list: unsupported node {node.op} {node.target}")
        if node.target is operator.getitem:
            base, index = node.args
            if base in list_results:
                nodes.append({"op": ITEM, "overload": "", "args": [{"t": slot_of[base]}, {"i": index}], "outputs": 1})
                slot_of[node] = next_slot
                next_slot += 1
            else:
                slot_of[node] = slot_of[base] + index
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            raise OpListError(f"op list: unsupported call {node.target} (not an aten operator)")
        schema = node.target._schema
        if schema.name in DROPPED:
            continue
        if _fresh_mask(node):
            # eager's dropout draws its mask with ``empty_like(x).bernoulli_(p)``, in x's memory order;
            # functionalization made it ``bernoulli.p``, which draws into a new contiguous tensor: another
            # order (other masks) when x is not contiguous (a batch-first attention's output)
            schema = torch.ops.aten.bernoulli_.float._schema
        args = _call_args(schema, node, slot_of)
        returns = len(schema.returns)
        if returns == 1 and isinstance(schema.returns[0].type, torch._C.ListType):
            list_results.add(node)
        nodes.append({"op": schema.name, "overload": schema.overload_name or "default", "args": args,
                      "outputs": returns})
        slot_of[node] = next_slot
        next_slot += max(returns, 1)
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(results) != len(outputs):
        raise OpListError(f"op list: the graph returns {len(results)} values, {len(outputs)} bindings given")
    return {"oplist_version": VERSION, "inputs": list(inputs), "nodes": nodes,
            "outputs": [{"ref": slot_of[r], "to": to} for r, to in zip(results, outputs) if to is not None]}


def _call_args(schema: Any, node: Any, slot_of: Dict[Any, int]) -> List[Dict[str, Any]]:
    """A call's arguments in its schema's order, encoded: positional, else by keyword, else the default."""
    args = []
    for i, argument in enumerate(schema.arguments):
        if i < len(node.args) and not argument.kwarg_only:
            value = node.args[i]
        elif argument.name in node.kwargs:
            value = node.kwargs[argument.name]
        elif argument.has_default_value():
            value = argument.default_value
        else:
            raise OpListError(f"op list: {schema.name} misses argument {argument.name}")
        args.append(encode_arg(value, slot_of, argument.type))
    return args


def batch_affine(small: Any, large: Any, b1: int, b2: int, where: str = "graph") -> Any:
    """Two op lists of one graph captured at batch sizes ``b1 < b2`` as one whose differing ints are
    ``{"bx": [a, c]}`` (``a * batch + c``); anything else that differs is refused."""
    if isinstance(small, dict) and isinstance(large, dict):
        if set(small) != set(large):
            raise OpListError(f"{where} changes with the batch size")
        if set(small) == {"i"} and small["i"] != large["i"]:
            return _affine(small["i"], large["i"], b1, b2, where)
        if set(small) in ({"il"}, {"sl"}) and small != large:
            a, b = small.get("il", small.get("sl")), large.get("il", large.get("sl"))
            if len(a) != len(b):
                raise OpListError(f"{where} changes rank with the batch size")
            return {"sl": [x if x == y else _affine(x, y, b1, b2, where) for x, y in zip(a, b)]}
        return {k: batch_affine(small[k], large[k], b1, b2, f"{where}.{k}") for k in small}
    if isinstance(small, list) and isinstance(large, list):
        if len(small) != len(large):
            raise OpListError(f"{where} changes with the batch size ({len(small)} vs {len(large)} items)")
        return [batch_affine(x, y, b1, b2, f"{where}[{i}]") for i, (x, y) in enumerate(zip(small, large))]
    if small != large:
        raise OpListError(f"{where} changes with the batch size ({small!r} vs {large!r})")
    return small


def _affine(x: Any, y: Any, b1: int, b2: int, where: str) -> Dict[str, List[int]]:
    if not (isinstance(x, int) and isinstance(y, int)) or (y - x) % (b2 - b1):
        raise OpListError(f"{where} changes with the batch size ({x!r} vs {y!r})")
    a = (y - x) // (b2 - b1)
    return {"bx": [a, x - a * b1]}


# ---- the Python interpreter (the native one's twin) ----

def _overload(op: str, overload: str, where: str = "op list") -> Any:
    return oplist_types.overload(op, overload, where)


def _batch_int(a: int, batch: int, c: int) -> int:
    """``a * batch + c``, refused past int64 (the native layer's batch_int)."""
    value = a * batch + c
    if not -(2 ** 63) <= a * batch < 2 ** 63 or not -(2 ** 63) <= value < 2 ** 63:
        raise OpListError(f"op list: {a} * batch {batch} + {c} overflows int64")
    return value


def _decode(arg: Any, slots: List[Any], batch: int) -> Any:
    if arg is None:
        return None
    (kind, value), = arg.items()
    if kind == "t":
        return slots[value]
    if kind == "tl":
        return [slots[v] for v in value]
    if kind == "otl":
        return [None if v is None else slots[v] for v in value]
    if kind in ("i", "b", "il", "bl", "s"):
        return value
    if kind == "bx":
        return _batch_int(value[0], batch, value[1])
    if kind == "sl":
        return [v if isinstance(v, int) else _batch_int(v["bx"][0], batch, v["bx"][1]) for v in value]
    if kind == "f":
        return float.fromhex(value)
    if kind == "fl":
        return [float.fromhex(v) for v in value]
    if kind == "dtype":
        return DTYPES[value]
    if kind == "layout":
        return LAYOUTS[value]
    if kind == "mf":
        return MEMORY_FORMATS[value]
    if kind == "device":
        return torch.device(value)
    raise OpListError(f"op list: unknown argument kind {kind!r}")


def check(graph: Mapping[str, Any], where: str) -> None:
    """What the native layer checks when it loads an op list, without running it (``oplist_types.check``)."""
    oplist_types.check(graph, where)


def forward_ops(graph: Mapping[str, Any]) -> int:
    """How many of a joint graph's first nodes are its forward (up to the one that computes ``loss``), which
    run with grad mode on as eager's forward does; autograd runs the backward with it off. A kernel may
    branch on grad mode: oneDNN's LSTM layer keeps the workspace its backward reads only with it on. 0 for
    a graph without gradients (evaluation, the optimizer, clipping: eager runs them under no_grad)."""
    outputs = {out["to"]: out["ref"] for out in graph["outputs"]}
    if "loss" not in outputs or not any(to.startswith("grad:") for to in outputs):
        return 0
    slots = len(graph["inputs"])
    for k, node in enumerate(graph["nodes"]):
        slots += max(node["outputs"], 1)
        if outputs["loss"] < slots:
            return k + 1
    return 0


def run(graph: Mapping[str, Any], values: Mapping[str, Any], name: str = "graph") -> Dict[str, Any]:
    """Run an op list on ``values`` (binding name -> tensor or double), its forward (``forward_ops``) with
    grad mode on, the rest under no_grad; returns its outputs by binding (``grad:`` outputs as returned,
    not accumulated: the caller accumulates)."""
    if graph.get("oplist_version") != VERSION:
        raise OpListError(f"op list version {graph.get('oplist_version')}, this gradbridge runs {VERSION}")
    slots: List[Any] = [values[name] for name in graph["inputs"]]
    first = next((name for name in graph["inputs"] if name.startswith("input:")),
                 "target" if "target" in graph["inputs"] else None)
    batch = int(values[first].shape[0]) if first is not None else 0
    forward = forward_ops(graph)
    done = _last_reads(graph)
    with torch.enable_grad():
        _run_nodes(graph["nodes"][:forward], slots, batch, 0, name, done)
    with torch.no_grad():
        _run_nodes(graph["nodes"][forward:], slots, batch, forward, name, done)
    return {out["to"]: slots[out["ref"]] for out in graph["outputs"]}


def _last_reads(graph: Mapping[str, Any]) -> Dict[int, List[int]]:
    """For each node, the slots no later node reads and no output names, let go after it (an optimizer step's
    temporaries one parameter at a time, not all of them till the step's end)."""
    last: Dict[int, int] = {}
    made = len(graph["inputs"])
    for k, node in enumerate(graph["nodes"]):
        for ref in range(made, made + max(node["outputs"], 1)):  # read by none: let go after it is made
            last[ref] = k
        made += max(node["outputs"], 1)
        for arg in node["args"]:
            (kind, value), = arg.items() if isinstance(arg, dict) else ((None, None),)
            refs = [value] if kind == "t" else [v for v in value if v is not None] if kind in ("tl", "otl") else []
            for ref in refs:
                last[ref] = k
    kept = {out["ref"] for out in graph["outputs"]}
    done: Dict[int, List[int]] = {}
    for ref, k in last.items():
        if ref not in kept:
            done.setdefault(k, []).append(ref)
    return done


def _run_nodes(nodes: Sequence[Mapping[str, Any]], slots: List[Any], batch: int, first: int, name: str,
               done: Mapping[int, List[int]]) -> None:
    for k, node in enumerate(nodes, first):
        for ref in done.get(k - 1, ()):
            slots[ref] = None
        args = [_decode(a, slots, batch) for a in node["args"]]
        where = f"op list {name} node {k} ({node['op']}.{node['overload']})"
        if node["op"] == ITEM:
            if not 0 <= args[1] < len(args[0]):
                raise OpListError(f"{where}: index {args[1]} of a list of {len(args[0])}")
            slots.append(args[0][args[1]])
            continue
        op = _overload(node["op"], node["overload"])
        schema = op._schema
        oplist_types.check_sizes(schema, args, where)
        if len(args) != len(schema.arguments):  # the native layer refuses it too: it calls the op boxed
            raise OpListError(f"op list: {node['op']}.{node['overload']}: {len(args)} arguments, the schema "
                              f"takes {len(schema.arguments)}")
        positional = [a for a, s in zip(args, schema.arguments) if not s.kwarg_only]
        keywords = {s.name: a for a, s in zip(args, schema.arguments) if s.kwarg_only}
        try:
            result = op(*positional, **keywords)
        except Exception as ex:  # the kernel's own check: one line, as the native layer's (its first line)
            raise OpListError(f"{where} failed: {(str(ex).strip().splitlines() or [type(ex).__name__])[0]}") from ex
        if node["outputs"] == 1:
            slots.append(result)
        elif node["outputs"] > 1:
            slots.extend(result)
        else:
            slots.append(None)
