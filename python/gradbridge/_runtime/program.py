"""A protocol-3 training module's program: its op lists (``oplist``), its state and how the protocol's
methods run them. ``Program`` is the Python twin of the native layer's (native/oplist_engine.h and its files):
the export's check runs it beside the user's eager model and torch.optim before anything is written.
``read_program`` reads a protocol-3 file (its metadata, op lists and state) with the native layer's checks.

Graphs (gradbridge.json ``program.graphs``): ``train`` (training mode: forward, loss and backward, one
joint graph; outputs the mutated buffers, ``loss`` and a ``grad:`` per trainable parameter),
``train_accumulate`` (the same with the loss divided by the accumulation count, with ``accumulate`` > 1),
``forward`` (eval mode: ``output``), ``loss`` (the loss of an ``output`` and the ``target``: ``evaluate`` is
``forward`` then ``loss``), ``clip`` (torch.nn.utils' gradient clipping, in place, when exported),
``optimizer`` (one torch.optim step of every group, in place), and for SGD with momentum
``optimizer_first`` (the step while no momentum buffer is held, the first or after a load of a state
without them: it creates the buffers). ``train@1``, ``forward@1`` and ``loss@1`` (``one``): the same
captured at one sample, which a batch of one runs (``min_batch`` 1); without them (``min_batch`` 2) a
batch of one is refused.

``training`` (``program.training``, fixed at export): the optimizer's name, its parameter groups (each
group's parameters and hyper-parameters), ``accumulate``, the schedule (``scheduler``: a resolved spec
with its ``base_lrs``, or absent) and ``scheduler_interval``. ``counters`` (``program.counters``, what a
checkpoint saves beside the state tensors): ``steps``, each group's current ``lrs`` and the schedule's
state (``last_epoch``, ReduceLROnPlateau's ``best``, ``num_bad_epochs``, ``cooldown_counter``, a
SequentialLR's ``children_last_epochs``) and ``momenta``, each group's momentum (SGD) or beta1 (Adam) as
OneCycleLR cycles it (empty when nothing cycles); doubles as ``float.hex`` text (exact, inf included).

Methods: ``calculate_loss_and_backward`` runs ``train`` and accumulates the gradients (a parameter without
one takes the new gradient, as autograd's ``AccumulateGrad``); ``zero_grad`` drops them (torch's
``set_to_none``); ``optimizer_step`` increments the step count, runs ``clip``, computes each group's
``host_scalars`` in double (torch.optim's Python arithmetic, one formula per optimizer), runs the step graph,
then steps a per-step schedule; ``train_step`` is zero_grad, calculate_loss_and_backward (or the
accumulation loop), optimizer_step; ``schedule_epoch`` steps a per-epoch schedule.
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import torch
from torch import Tensor

from . import oplist, oplist_check, program_check
from .. import messages, protocol

#: The optimizers protocol 3 exports (torch.optim's single-tensor op sequences, ``export.protocol3_capture``).
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad")
#: The schedules protocol 3 holds (``spec.schedulers`` names), each with the options its formula reads.
SCHEDULERS: Dict[str, tuple] = {
    "step": ("step_size", "gamma"), "multistep": ("milestones", "gamma"), "exponential": ("gamma",),
    "cosine": ("T_max", "eta_min"), "linear": ("start_factor", "end_factor", "total_iters"),
    "plateau": ("minimize", "relative", "factor", "patience", "threshold", "cooldown", "min_lrs", "eps"),
    "sequential": ("milestones",),  # and its ``schedulers``, each resolved
    # OneCycleLR as torch's construction resolved it (scheduler_modules.OneCycleLR): per group its initial,
    # max and min lrs and momenta, the phases' end steps and which value each phase starts and ends at
    "onecycle": ("total_steps", "initial", "max_lrs", "min_lrs", "end_steps", "start_keys", "end_keys",
                 "start_momentum_keys", "end_momentum_keys", "cos", "cycle_momentum", "max_momenta", "base_momenta"),
}
#: The smallest batch (and micro-batch) a protocol-3 graph captured at two sizes runs (a size-1 batch is
#: one torch.export specializes on: a batch of one runs the graphs captured at one sample, ``one``).
MIN_BATCH = 2


def one(graph: str) -> str:
    """The name of graph ``graph`` captured at one sample."""
    return f"{graph}@1"


def scalar_binding(name: str, group: int) -> str:
    """The op-list binding of host scalar ``name`` of parameter group ``group``."""
    return f"scalar:{name}:{group}"


def host_scalars(name: str, hyper: Mapping[str, Any], lr: float, step: int,
                 momentum: Optional[float] = None) -> Dict[str, float]:
    """The per-step doubles torch.optim computes in Python for one group (the specification the native twin
    follows): SGD and RMSprop ``-lr`` and their ``momentum``; Adam/AdamW ``1 - beta1``, the bias corrections of
    step ``step`` (1-based) and AdamW's decay factor; Adagrad ``-clr``, its decayed rate. ``momentum``: the
    group's momentum (SGD, RMSprop) or beta1 (Adam) as OneCycleLR cycled it, None for the group's own."""
    if name in ("sgd", "rmsprop"):
        return {"neg_lr": -lr, "momentum": hyper["momentum"] if momentum is None else momentum}
    step_f = float(step)
    if name == "adagrad":
        return {"neg_clr": -(lr / (1 + (step_f - 1) * hyper["lr_decay"]))}
    beta1, beta2 = hyper["betas"]
    if momentum is not None:
        beta1 = momentum
    bias_correction1 = 1 - beta1 ** step_f
    bias_correction2 = 1 - beta2 ** step_f
    step_size = lr / bias_correction1
    return {"one_minus_beta1": 1 - beta1, "neg_step_size": -step_size,
            "bias_correction2_sqrt": bias_correction2 ** 0.5, "decay": 1 - lr * hyper["weight_decay"]}


def schedule_spec(given: Mapping[str, Any], module: Any) -> Dict[str, Any]:
    """The resolved spec of a schedule (``program.training.scheduler``) of the spec ``given``: the options
    its formula reads, read from the schedule module ``spec.schedulers.build`` made (torch's defaults
    filled in), its base lrs as ``float.hex`` text, and a SequentialLR's children resolved alike."""
    name = given["name"]
    spec: Dict[str, Any] = {"name": name, "base_lrs": [float(v).hex() for v in module.base_lrs]}
    for key in SCHEDULERS[name]:
        value = getattr(module, key)
        exact = key == "min_lrs" or (isinstance(value, list) and any(isinstance(v, float) for v in value))
        spec[key] = [float(v).hex() for v in value] if exact else value
    if name == "sequential":
        spec["schedulers"] = [schedule_spec(child, m) for child, m in zip(given["schedulers"], module.children_list)]
    return spec


def initial_counters(lrs: List[float], schedule: Optional[Any]) -> Dict[str, Any]:
    """``program.counters`` before the first step: the schedule module's state as torch's fresh scheduler's
    (a SequentialLR's children's epochs in ``children_last_epochs``)."""
    return {"steps": 0, "lrs": [float(v).hex() for v in lrs],
            "last_epoch": int(getattr(schedule, "last_epoch", 0)),
            "best": float(getattr(schedule, "best", 0.0)).hex(),
            "num_bad_epochs": int(getattr(schedule, "num_bad_epochs", 0)),
            "cooldown_counter": int(getattr(schedule, "cooldown_counter", 0)),
            "children_last_epochs": [int(c.last_epoch) for c in getattr(schedule, "children_list", [])],
            "momenta": [float(v).hex() for v in getattr(schedule, "last_momenta", [])]}


class Program:
    """A protocol-3 module in Python: ``graphs`` by name, ``state`` by binding name, ``training`` and
    ``counters`` (see the module's docstring); ``schedule``: the scheduler module the export built (its
    arithmetic is the native layer's specification), or None."""

    def __init__(self, graphs: Mapping[str, Any], state: Mapping[str, Tensor], parameters: List[str],
                 training: Mapping[str, Any], counters: Mapping[str, Any], schedule: Optional[Any] = None,
                 where: str = "", own: bool = False):
        """``own``: ``state``'s tensors are the program's to change (``read_program``'s), not copied."""
        self.where = where  # its file: the start of its error lines
        self.graphs = dict(graphs)
        self.state = dict(state) if own else {name: t.clone() for name, t in state.items()}
        self.parameters = list(parameters)
        self.training = dict(training)
        self.trainable = [name for group in training["groups"] for name in group["params"]]
        self.lrs = [float.fromhex(v) for v in counters["lrs"]]
        self.steps = int(counters["steps"])
        self.momenta = [float.fromhex(v) for v in counters.get("momenta", [])]
        self.schedule = schedule

    def _run(self, graph: str, values: Dict[str, Any], batch: int = 0) -> Dict[str, Any]:
        """Runs ``graph``, or its capture at one sample for a ``batch`` of one (the native layer's graph_for)."""
        if batch == 1 and one(graph) in self.graphs:
            graph = one(graph)
        elif 0 < batch < MIN_BATCH:
            raise oplist.OpListError(f"a batch of {batch} samples: this protocol-3 module runs batches of at least "
                                     f"{MIN_BATCH}")
        merged = dict(self.state)
        merged.update(values)
        try:
            return oplist.run(self.graphs[graph], merged, graph)
        except oplist.OpListError as ex:
            raise oplist.OpListError(f"{self.where}: {ex}" if self.where else str(ex)) from ex

    @staticmethod
    def _inputs(x: Mapping[str, Tensor]) -> Dict[str, Tensor]:
        return {f"input:{name}": t for name, t in x.items()}

    def _backward(self, graph: str, x: Mapping[str, Tensor], y: Tensor) -> Tensor:
        out = self._run(graph, {**self._inputs(x), "target": y}, len(y))
        for to, value in out.items():
            if to.startswith("grad:"):
                held = self.state.get(to)
                self.state[to] = value if held is None else held.add_(value)
            elif to.startswith("buffer:"):
                self.state[to] = value
        return out["loss"]

    def calculate_loss_and_backward(self, x: Mapping[str, Tensor], y: Tensor) -> Tensor:
        return self._backward("train", x, y)

    def zero_grad(self) -> None:
        for name in self.parameters:
            self.state.pop(f"grad:{name}", None)

    def optimizer_step(self) -> None:
        self.steps += 1
        if "clip" in self.graphs:
            self._run("clip", {})
        name = self.training["optimizer"]
        scalars = {}
        for g, (group, lr) in enumerate(zip(self.training["groups"], self.lrs)):
            momentum = self.momenta[g] if self.momenta else None
            for key, value in host_scalars(name, group, lr, self.steps, momentum).items():
                scalars[scalar_binding(key, g)] = value
        # SGD's first step with momentum (no buffer held yet, torch's None) creates the buffers
        first = "optimizer_first" in self.graphs and not any(
            out["to"] in self.state for out in self.graphs["optimizer_first"]["outputs"])
        graph = "optimizer_first" if first else "optimizer"
        self.state.update(self._run(graph, scalars))
        if self.schedule is not None and self.training["scheduler_interval"] == "step":
            self.lrs = self.schedule.step(self.lrs)
            self._cycled()

    def schedule_epoch(self, metric: float) -> None:
        if self.schedule is not None and self.training["scheduler_interval"] == "epoch":
            self.lrs = self.schedule.step_metric(self.lrs, metric)
            self._cycled()

    def _cycled(self) -> None:
        """OneCycleLR's momenta after its step (torch writes them into the groups)."""
        if self.schedule.momenta():
            self.momenta = list(self.schedule.momenta())

    def train_step(self, x: Mapping[str, Tensor], y: Tensor) -> Tensor:
        self.zero_grad()
        k = int(self.training["accumulate"])
        if k == 1:
            loss = self.calculate_loss_and_backward(x, y)
        else:  # eager's accumulation loop: (loss / k).backward() per micro-batch of ceil(n / k) rows
            size = math.ceil(len(y) / k)
            loss = None
            for m, ym in enumerate(y.split(size)):
                xm = {n: t.split(size)[m] for n, t in x.items()}
                scaled = self._backward("train_accumulate", xm, ym)
                with torch.no_grad():
                    loss = scaled if loss is None else loss + scaled
        self.optimizer_step()
        return loss

    def forward(self, x: Mapping[str, Tensor]) -> Tensor:
        return self._run("forward", self._inputs(x), len(next(iter(x.values()))))["output"]

    def evaluate(self, x: Mapping[str, Tensor], y: Tensor) -> Tensor:
        return self._run("loss", {"output": self.forward(x), "target": y}, len(y))["loss"]


def _entry_spec(metadata: Dict[str, Any], name: str) -> Any:
    """The dtype and shape a state entry must have, or None (a constant the model makes)."""
    kind, _, rest = name.partition(":")
    if kind == "state":
        key, _, rest = rest.partition(":")
        if key == "step":
            return "float32", []
        kind = "param"
    specs = metadata["parameters"] if kind == "param" else metadata["buffers"] if kind == "buffer" else []
    for spec in specs:
        if spec["name"] == rest:
            return spec["dtype"], list(spec["shape"])
    return None


def read_program(path: Path) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Tensor]]:
    """A protocol-3 file's metadata, graphs and state tensors, read as data with the native layer's checks
    (Java's ``ProgramCheck``, check for check): the program entry, training and counters (``program_check``),
    each op list (``oplist_check``: strict JSON, the allow-list, the limits; then ``oplist.check`` against
    this torch's schemas), each state entry and its bytes; one line naming what is missing or wrong."""
    metadata = protocol.read_metadata(path)
    if metadata.get("protocol_version") != protocol.EXPORT_PROTOCOL_VERSION:
        raise protocol.ProtocolError(f"{path}: protocol {metadata.get('protocol_version')}, not a protocol-3 module")
    try:  # read again, strictly (Java's reader reads it so too)
        with zipfile.ZipFile(path) as archive:
            strict = oplist_check.load_json(_bounded(archive, protocol.METADATA_FILE, oplist_check.LIMITS["json_bytes"]),
                                            protocol.METADATA_FILE)
    except oplist.OpListError as ex:
        raise protocol.ProtocolError(f"{path}: {ex}") from ex
    entry = strict.get(protocol.PROGRAM_KEY) if isinstance(strict, dict) else None
    if not isinstance(entry, dict):
        raise protocol.ProtocolError(messages.program_entry_missing(str(path), protocol.PROGRAM_KEY))
    if entry.get("oplist_version") != oplist.VERSION or isinstance(entry.get("oplist_version"), bool):
        raise protocol.ProtocolError(messages.program_version(str(path), oplist_check.shown(json.dumps(entry.get("oplist_version"))),
                                                              oplist.VERSION))
    try:
        for key in ("training", "counters"):
            if not isinstance(entry.get(key), dict):
                raise protocol.ProtocolError(messages.program_entry_missing(str(path), f"{protocol.PROGRAM_KEY}.{key}"))
        program_check.check_training(entry["training"], entry["counters"], protocol.PROGRAM_KEY)
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            graphs = _read_graphs(path, archive, entry, names)
            state = _read_state(path, archive, entry, names, metadata)
        for name, graph in graphs.items():
            oplist.check(graph, f"op list {oplist_check.shown(name)}")
        _check_bound(graphs, state)
    except oplist.OpListError as ex:
        raise protocol.ProtocolError(f"{path}: {ex}") from ex
    except (zipfile.BadZipFile, zlib.error, KeyError, TypeError, ValueError, OSError, RecursionError,
            NotImplementedError, RuntimeError) as ex:  # an encrypted entry is a RuntimeError
        raise protocol.ProtocolError(messages.program_unreadable(str(path), messages.one_line(ex)[:300])) from ex
    return metadata, graphs, state


def _read_graphs(path: Path, archive: zipfile.ZipFile, entry: Dict[str, Any], names: Set[str]) -> Dict[str, Any]:
    """The program entry's op lists by role, each read strictly and checked (``oplist_check``), all roles there."""
    graphs = {}
    files = entry.get("graphs")
    if not isinstance(files, dict):
        raise protocol.ProtocolError(messages.program_entry_missing(str(path), f"{protocol.PROGRAM_KEY}.graphs"))
    for name, file in files.items():
        where = f"op list {oplist_check.shown(name)}"
        if not isinstance(file, str) or file not in names:
            raise protocol.ProtocolError(messages.program_entry_missing(str(path), oplist_check.shown(file)))
        graphs[name] = oplist_check.load_json(_bounded(archive, file, oplist_check.LIMITS["json_bytes"]), where)
        oplist_check.check_graph(graphs[name], where)
        oplist_check.check_role(name, graphs[name], where)
    oplist_check.check_required(graphs, f"{protocol.PROGRAM_KEY}.graphs")
    return graphs


def _read_state(path: Path, archive: zipfile.ZipFile, entry: Dict[str, Any], names: Set[str],
                metadata: Dict[str, Any]) -> Dict[str, Tensor]:
    """The program entry's state tensors by name, each entry checked against the metadata and read whole."""
    specs = entry.get("state")
    if not isinstance(specs, list):
        raise protocol.ProtocolError(messages.program_entry_missing(str(path), f"{protocol.PROGRAM_KEY}.state"))
    state = {}
    for k, spec in enumerate(specs):
        program_check.state_entry(spec, f"{protocol.PROGRAM_KEY}.state[{k}]")
        if spec["file"] not in names:
            raise protocol.ProtocolError(messages.program_entry_missing(str(path), spec["file"]))
        expected = _entry_spec(metadata, spec["name"])
        actual = (spec["dtype"], list(spec["shape"]))
        if spec["dtype"] not in oplist.DTYPES or (expected is not None and actual != expected):
            raise protocol.ProtocolError(messages.program_state_mismatch(
                str(path), spec["name"], _text(expected), _text(actual)))
        dtype = oplist.DTYPES[spec["dtype"]]
        needed = math.prod(spec["shape"]) * dtype.itemsize
        tensor = torch.empty(spec["shape"], dtype=dtype)
        size = _read_into(archive, spec["file"], tensor)
        if size != needed:
            size = max(size, archive.getinfo(spec["file"]).file_size)
            raise protocol.ProtocolError(messages.program_state_bytes(str(path), spec["file"], size,
                                                                      spec["name"], _text(actual), needed))
        state[spec["name"]] = tensor
    return state


def _bounded(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """An entry's bytes, at most ``limit`` + 1 of them read (an entry that inflates past it is refused by its
    caller, whatever its header says), its CRC-32 checked when read whole."""
    with archive.open(name) as entry:
        data = entry.read(limit + 1)
        if len(data) <= limit:
            entry.read()  # to its end: zipfile checks the CRC-32 there
    if len(data) > limit and limit == oplist_check.LIMITS["json_bytes"]:
        raise oplist.OpListError(f"{name}: inflates past the limit of {limit} bytes")
    return data


#: Bytes of a state entry read at a time, straight into its tensor.
_CHUNK = 1 << 24


def _read_into(archive: zipfile.ZipFile, name: str, tensor: Tensor) -> int:
    """An entry's bytes read into ``tensor``'s memory as they come (its CRC-32 checked at the end); how many
    the entry holds, counted up to one more than the tensor takes."""
    memory = memoryview(tensor.reshape(-1).view(torch.uint8).numpy()) if tensor.numel() else memoryview(b"")
    filled = 0
    with archive.open(name) as entry:
        while filled < len(memory):
            chunk = entry.read(min(_CHUNK, len(memory) - filled))
            if not chunk:
                return filled
            memory[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
        if entry.read(1):
            return filled + 1
    return filled


def _check_bound(graphs: Dict[str, Any], state: Dict[str, Tensor]) -> None:
    """A state binding a graph reads must be held, unless the first optimizer step creates it (SGD's momentum)
    and none of those is held; the native layer's check_bound."""
    created = {out["to"] for out in graphs.get("optimizer_first", {}).get("outputs", [])}
    none_created = not created & set(state)
    for name, graph in graphs.items():
        for binding in graph["inputs"]:
            if binding.split(":")[0] not in ("param", "buffer", "const", "state") or binding in state:
                continue
            if not (none_created and binding in created):
                raise oplist.OpListError(f"op list {name} reads state tensor {binding}, which the file lacks")


def _text(spec: Any) -> str:
    return "a constant" if spec is None else f"{spec[0]} {list(spec[1])}"
