"""``export_training_module(..., format="export")``: protocol 3, a training step captured as aten graphs.

The model and its loss are captured with ``torch.export.export(strict=False)``, then functorch's
``aot_export_module(..., trace_joint=True, output_loss_index=0, decompositions={})`` gives the joint
forward+backward graph (training mode; dropout's random mask in graph order on torch's generator): no
decomposition, and ``traceable.while_capturing`` keeps the trace on eager's kernels, so every op is the one
eager autograd calls. ``forward`` and the ``loss`` are captured in eval mode. The optimizer step is
torch.optim's single-tensor op sequence, written here op by op with the per-step Python doubles as host
scalars (``program.host_scalars``).

Shapes: each graph is captured at the example's batch size and at one more; the sizes that change between
the two become ``a * batch + c`` (``oplist.batch_affine``), anything else that changes is refused. The
check then runs the program (``program.Program``, the native interpreter's twin) beside the user's eager
model and torch.optim, bit for bit, at both sizes, before the file is written.

The file: a zip of ``gradbridge.json`` (protocol 3; ``program`` names the graphs and the state), one op
list per graph (``graphs/NAME.json``) and the state tensors (``state/K.bin``, raw little-endian bytes).
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import warnings
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .. import inputs as model_inputs, libtorch, messages, oplist, program, protocol
from .._version import __version__
from ..errors import ExportError
from ..files import atomic_path
from . import losses, optim, self_check, traceable

log = logging.getLogger(__name__)


class _Step(nn.Module):
    """The model then its loss, over positional tensors (the inputs in order, then y)."""

    def __init__(self, model: nn.Module, loss: nn.Module, names: Sequence[str]):
        super().__init__()
        self.m = model
        self.loss = loss
        self.names = list(names)

    def forward(self, *args: Tensor) -> Tuple[Tensor]:
        *xs, y = args
        return (self.loss(_call(self.m, self.names, xs), y),)


class _Forward(nn.Module):
    def __init__(self, model: nn.Module, names: Sequence[str]):
        super().__init__()
        self.m = model
        self.names = list(names)

    def forward(self, *xs: Tensor) -> Tuple[Tensor]:
        return (_call(self.m, self.names, xs),)


class _Loss(nn.Module):
    def __init__(self, loss: nn.Module):
        super().__init__()
        self.loss = loss

    def forward(self, output: Tensor, y: Tensor) -> Tuple[Tensor]:
        return (self.loss(output, y),)


def _call(model: nn.Module, names: Sequence[str], xs: Sequence[Tensor]) -> Tensor:
    return model(xs[0]) if model_inputs.is_single(names) else model(**dict(zip(names, xs)))


def _strip(name: str) -> str:
    return name[2:] if name.startswith("m.") else name


def _capture(module: nn.Module, args: Tuple[Tensor, ...], joint: bool, input_bindings: List[str],
             constants: Dict[str, Tensor], result: str = "output") -> Tuple[Dict[str, Any], List[str]]:
    """One graph as an op list; returns it and the parameter names of its ``grad:`` outputs."""
    from torch._functorch.aot_autograd import aot_export_module

    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), traceable.while_capturing() as functions:
            # torch.export's unlifting warns about the constants it re-attaches; they are lifted to state below
            warnings.filterwarnings("ignore", message=".*get_attr.*", category=UserWarning)
            exported = torch.export.export(module, args, strict=False)
            if functions:
                raise ExportError(messages.aten_option_refused(f"custom autograd.Function {functions[0]} (torch.export "
                                                               "keeps its forward, not its backward)"))
            own = {n for n, _ in itertools.chain(module.named_parameters(), module.named_buffers())}
            gm, signature = aot_export_module(traceable.share_tied(exported.module(), own), args, trace_joint=joint,
                                              output_loss_index=0 if joint else None, decompositions={})
    except ExportError:
        raise
    except Exception as ex:  # torch raises many kinds here; the reason is its first line
        raise ExportError(messages.aten_capture_failed(type(module.m if hasattr(module, "m") else module).__name__,
                                                       traceable.capture_failure(ex))) from ex
    bindings = [f"param:{_strip(n)}" for n in signature.parameters]
    bindings += [f"buffer:{_strip(n)}" for n in signature.buffers]
    bindings += input_bindings
    # Tensor constants the model makes (``torch.tensor(...)`` in forward) stay graph attributes: lifted
    # to state here, so the op list holds only placeholders.
    for node in list(gm.graph.nodes):
        if node.op == "get_attr":
            name = f"const:{node.target}"
            constants[name] = getattr(gm, node.target).detach().clone()
            with gm.graph.inserting_before(next(n for n in gm.graph.nodes if n.op != "placeholder")):
                placeholder = gm.graph.placeholder(name.replace(":", "_").replace(".", "_"))
            node.replace_all_uses_with(placeholder)
            gm.graph.erase_node(node)
            bindings.append(name)
    outputs: List[Any] = [f"buffer:{_strip(n)}" for n in signature.buffers_to_mutate.values()]
    if joint:
        outputs.append("loss")
        grads = [_strip(n) for n in signature.backward_signature.gradients_to_parameters.values()]
        outputs += [f"grad:{n}" for n in grads]
    else:
        outputs.append(result)
        grads = []
    return oplist.from_fx(gm.graph, bindings, outputs), grads


def _grow(batch: Tensor) -> Tensor:
    """The batch with its first row again at the end (one more sample, real data)."""
    return torch.cat([batch, batch[:1]])


def _graph_at_two_sizes(make: Any, args: Tuple[Tensor, ...], joint: bool, bindings: List[str],
                        constants: Dict[str, Tensor], name: str, result: str = "output"
                        ) -> Tuple[Dict[str, Any], List[str]]:
    b = int(args[0].shape[0])
    small, grads = _capture(make(), args, joint, bindings, constants, result)
    large, _ = _capture(make(), tuple(_grow(a) for a in args), joint, bindings, constants, result)
    try:
        return oplist.batch_affine(small, large, b, b + 1, name), grads
    except oplist.OpListError as ex:
        raise ExportError(messages.aten_batch_dependent(str(ex))) from ex


def capture_probe() -> int:
    """A one-layer model's training step captured as every export captures one (`gradbridge doctor`): the
    number of ops in its op list; ExportError when this torch cannot."""
    model = nn.Linear(2, 1)
    graph, _ = _capture(_Step(model, nn.MSELoss(), [model_inputs.X]).train(), (torch.ones(2, 2), torch.ones(2, 1)),
                        True, [f"input:{model_inputs.X}", "target"], {})
    return len(graph["nodes"])


def _sgd_graph(names: Sequence[str], hyper: Dict[str, Any], first: bool) -> Dict[str, Any]:
    """torch.optim.SGD's ``_single_tensor_sgd`` for each parameter (torch 2.7-2.15's op sequence)."""
    b = _Builder(["scalar:neg_lr"])
    momentum = hyper["momentum"] != 0
    slots = [(b.input(f"param:{n}"), b.input(f"grad:{n}"),
              b.input(f"state:momentum_buffer:{n}") if momentum and not first else None) for n in names]
    for name, (param, grad, buf) in zip(names, slots):
        if hyper["weight_decay"] != 0:
            grad = b.op("aten::add", "Tensor", [{"t": grad}, {"t": param}, b.f(hyper["weight_decay"])])
        if momentum:
            if first:
                buf = b.op("aten::clone", "default", [{"t": grad}, None])
                b.outputs.append({"ref": buf, "to": f"state:momentum_buffer:{name}"})
            else:
                b.op("aten::mul_", "Scalar", [{"t": buf}, b.f(hyper["momentum"])])
                b.op("aten::add_", "Tensor", [{"t": buf}, {"t": grad}, b.f(1 - hyper["dampening"])])
            grad = (b.op("aten::add", "Tensor", [{"t": grad}, {"t": buf}, b.f(hyper["momentum"])])
                    if hyper["nesterov"] else buf)
        b.op("aten::add_", "Tensor", [{"t": param}, {"t": grad}, {"t": 0}])
    return b.graph()


def _adam_graph(names: Sequence[str], hyper: Dict[str, Any], decoupled: bool) -> Dict[str, Any]:
    """torch.optim.Adam/AdamW's ``_single_tensor_adam`` for each parameter (not amsgrad, not maximize)."""
    b = _Builder(["scalar:neg_step_size", "scalar:bias_correction2_sqrt", "scalar:decay"])
    beta1, beta2 = hyper["betas"]
    slots = [tuple(b.input(f"{kind}:{n}") for kind in ("param", "grad", "state:exp_avg", "state:exp_avg_sq",
                                                        "state:step")) for n in names]
    for param, grad, exp_avg, exp_avg_sq, step in slots:
        b.op("aten::add_", "Scalar", [{"t": step}, {"i": 1}, {"i": 1}])
        if hyper["weight_decay"] != 0:
            if decoupled:
                b.op("aten::mul_", "Scalar", [{"t": param}, {"t": 2}])
            else:
                grad = b.op("aten::add", "Tensor", [{"t": grad}, {"t": param}, b.f(hyper["weight_decay"])])
        b.op("aten::lerp_", "Scalar", [{"t": exp_avg}, {"t": grad}, b.f(1 - beta1)])
        b.op("aten::mul_", "Scalar", [{"t": exp_avg_sq}, b.f(beta2)])
        b.op("aten::addcmul_", "default", [{"t": exp_avg_sq}, {"t": grad}, {"t": grad}, b.f(1 - beta2)])
        root = b.op("aten::sqrt", "default", [{"t": exp_avg_sq}])
        denom = b.op("aten::div", "Scalar", [{"t": root}, {"t": 1}])
        b.op("aten::add_", "Scalar", [{"t": denom}, b.f(hyper["eps"]), {"i": 1}])
        b.op("aten::addcdiv_", "default", [{"t": param}, {"t": exp_avg}, {"t": denom}, {"t": 0}])
    return b.graph()


class _Builder:
    """Writes an op list by hand (the optimizer's step): the host scalars, then every input, then the ops."""

    def __init__(self, scalars: List[str]):
        self.inputs = list(scalars)
        self.nodes: List[Dict[str, Any]] = []
        self.outputs: List[Dict[str, Any]] = []

    def input(self, binding: str) -> int:
        assert not self.nodes, "op list: inputs take the first slots"
        self.inputs.append(binding)
        return len(self.inputs) - 1

    @staticmethod
    def f(value: float) -> Dict[str, str]:
        return {"f": float(value).hex()}

    def op(self, name: str, overload: str, args: List[Any]) -> int:
        self.nodes.append({"op": name, "overload": overload, "args": args, "outputs": 1})
        return len(self.inputs) + len(self.nodes) - 1

    def graph(self) -> Dict[str, Any]:
        return {"oplist_version": oplist.VERSION, "inputs": self.inputs, "nodes": self.nodes, "outputs": self.outputs}


def _optimizer_graphs(names: Sequence[str], spec: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    if spec["name"] == "sgd":
        graphs = {"optimizer": _sgd_graph(names, spec, first=False)}
        if spec["momentum"] != 0:
            graphs["optimizer_first"] = _sgd_graph(names, spec, first=True)
        return graphs
    return {"optimizer": _adam_graph(names, spec, decoupled=spec["name"] == "adamw")}


def _initial_optimizer_state(spec: Dict[str, Any], named: Sequence[Tuple[str, Tensor]]) -> Dict[str, Tensor]:
    """torch.optim's state before the first step: Adam's zeros and step 0 (SGD's buffer comes with step 1)."""
    state: Dict[str, Tensor] = {}
    if spec["name"] in ("adam", "adamw"):
        for name, p in named:
            state[f"state:step:{name}"] = torch.tensor(0.0, dtype=torch.float32)
            state[f"state:exp_avg:{name}"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state[f"state:exp_avg_sq:{name}"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return state


#: ``export_training_module``'s options that protocol 3 does not hold yet, with the value that means "unset".
UNSUPPORTED_OPTIONS = {"freeze": (), "scheduler": None, "clip_grad_norm": None, "clip_grad_value": None,
                       "accumulate": 1, "init_weights": None, "inputs": None}


def _check_options(options: Dict[str, Any]) -> None:
    for key, unset in UNSUPPORTED_OPTIONS.items():
        value = options.get(key, unset)
        if not (value is unset or value == unset or (key == "freeze" and not value)):
            raise ExportError(messages.aten_option_refused(key))


def _optimizer(optimizer: Any) -> Dict[str, Any]:
    """The optimizer's spec with every hyper-parameter (one group), refused unless protocol 3 holds it."""
    spec = optim.spec_of(optimizer) if isinstance(optimizer, torch.optim.Optimizer) else (
        {"name": optimizer} if isinstance(optimizer, str) else dict(optimizer))
    if "groups" in spec:
        raise ExportError(messages.aten_option_refused("parameter groups"))
    name = spec.get("name")
    if name not in program.OPTIMIZERS:
        raise ExportError(messages.aten_optimizer_refused(str(name), program.OPTIMIZERS))
    hyper = optim.build(spec, []).hyperparameters()
    for key in ("maximize", "amsgrad"):
        if hyper.get(key):
            raise ExportError(messages.aten_option_refused(f"{name} {key}=True"))
    return {"name": name, **hyper}


def _bits(t: Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def export(model: nn.Module, loss: Any, optimizer: Any, path: Path, *, example_inputs: Any, model_name: Any,
           check: bool, options: Dict[str, Any], auto_reason: Optional[str] = None) -> Path:
    """See ``export_training_module`` (format="export") and this module's docstring. ``auto_reason``: why
    format="auto" did not take TorchScript (recorded in the metadata's ``capture``)."""
    from .training_module import _loss_spec, _spec_from_example

    _check_options(options)
    if example_inputs is None:
        raise ExportError(messages.aten_option_refused("inputs without example_inputs"))
    if not isinstance(example_inputs, (tuple, list)) or len(example_inputs) != 2 \
            or not isinstance(example_inputs[1], Tensor):
        raise ValueError("example_inputs must be (x, y) with y a tensor")
    loss_spec = _loss_spec(loss)
    loss_module = losses.build(loss_spec)
    loss_spec = {"name": loss_spec["name"], **loss_module.options()}
    spec = _optimizer(optimizer)
    input_names, example_x = model_inputs.of_example(model, example_inputs[0])
    x = model_inputs.arrays(example_x)
    y = example_inputs[1]
    batch = int(y.shape[0])
    if batch < program.MIN_BATCH:
        raise ExportError(messages.aten_batch_too_small(batch, program.MIN_BATCH))
    model = copy.deepcopy(model)
    named = list(model.named_parameters())
    if not named:
        raise ValueError(f"{type(model).__name__} has no parameters: nothing to train")
    frozen = [n for n, p in named if not p.requires_grad]
    if frozen:
        raise ExportError(messages.aten_option_refused(f"frozen parameters ({frozen[0]})"))
    eager = copy.deepcopy(model)
    names = [n for n, _ in named]
    xs = tuple(x[n] for n in input_names)
    input_bindings = [f"input:{n}" for n in input_names]
    constants: Dict[str, Tensor] = {}

    model.train()
    train, grads = _graph_at_two_sizes(lambda: _Step(model, loss_module, input_names).train(), (*xs, y), True,
                                       input_bindings + ["target"], constants, "train")
    missing = [n for n in names if n not in grads]
    if missing:
        raise ExportError(messages.aten_no_gradient(missing[0]))
    model.eval()
    forward, _ = _graph_at_two_sizes(lambda: _Forward(model, input_names).eval(), xs, False, input_bindings,
                                     constants, "forward")
    with torch.no_grad():
        output = _call(model, input_names, xs)
    loss_graph, _ = _graph_at_two_sizes(lambda: _Loss(loss_module).eval(), (output, y), False,
                                        ["output", "target"], constants, "loss", "loss")
    model.train()
    graphs = {"train": train, "forward": forward, "loss": loss_graph, **_optimizer_graphs(names, spec)}

    state: Dict[str, Tensor] = {f"param:{n}": p.detach().clone() for n, p in named}
    buffers = list(model.named_buffers())
    state.update({f"buffer:{n}": b.detach().clone() for n, b in buffers})
    state.update(constants)
    state.update(_initial_optimizer_state(spec, named))
    bound = {b for g in graphs.values() for b in g["inputs"]}
    for name in bound:
        if name.split(":")[0] in ("param", "buffer", "const") and name not in state:
            raise ExportError(messages.aten_unbound(name))

    if check:
        _check(eager, loss_module, spec, graphs, state, names, input_names, x, y)

    specs = [_spec_from_example(n, t) for n, t in x.items()] + [_spec_from_example("y", y)]
    persistent = model.state_dict(keep_vars=True)
    metadata = protocol.build_metadata(
        model=model_name or type(model).__name__,
        parameters=[{**protocol.tensor_spec(n, p.shape, _dtype(p), kind="parameter"), "trainable": True}
                    for n, p in named],
        buffers=[protocol.buffer_spec(n, b.shape, _dtype(b), n in persistent) for n, b in buffers],
        loss=loss_spec, optimizer=spec, inputs=specs, torch_version=libtorch.torch_version(),
        gradbridge_version=__version__, protocol_version=protocol.EXPORT_PROTOCOL_VERSION,
        methods=protocol.PROTOCOL3_METHODS,
    )
    metadata[protocol.CAPTURE_KEY] = {"kind": "export", "checked": check,
                                      **({protocol.AUTO_REASON_KEY: auto_reason} if auto_reason else {})}
    entries = [{"name": name, "dtype": _dtype(t), "shape": list(t.shape), "file": f"state/{i}.bin"}
               for i, (name, t) in enumerate(state.items())]
    metadata[protocol.PROGRAM_KEY] = {
        "oplist_version": oplist.VERSION, "min_batch": program.MIN_BATCH,
        "graphs": {name: f"graphs/{name}.json" for name in graphs}, "state": entries}
    path = Path(path)
    with atomic_path(path) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(protocol.METADATA_FILE, json.dumps(metadata, indent=2))
            for name, graph in graphs.items():
                archive.writestr(f"graphs/{name}.json", json.dumps(graph, separators=(",", ":")))
            for entry, tensor in zip(entries, state.values()):
                archive.writestr(entry["file"], _bits(tensor))
    log.info("wrote %s", path)
    return path


def _dtype(t: Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def read_program(path: Path) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Tensor]]:
    """A protocol-3 file's metadata, graphs and state tensors (one line naming what is missing)."""
    metadata = protocol.read_metadata(path)
    if metadata.get("protocol_version") != protocol.EXPORT_PROTOCOL_VERSION:
        raise protocol.ProtocolError(f"{path}: protocol {metadata.get('protocol_version')}, not a protocol-3 module")
    entry = metadata[protocol.PROGRAM_KEY]
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        graphs = {}
        for name, file in entry["graphs"].items():
            if file not in names:
                raise protocol.ProtocolError(messages.program_entry_missing(str(path), file))
            graphs[name] = json.loads(archive.read(file))
        state = {}
        for spec in entry["state"]:
            if spec["file"] not in names:
                raise protocol.ProtocolError(messages.program_entry_missing(str(path), spec["file"]))
            raw = bytearray(archive.read(spec["file"]))
            dtype = oplist.DTYPES[spec["dtype"]]
            flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            state[spec["name"]] = flat.view(dtype).reshape(spec["shape"]).clone()
    return metadata, graphs, state


def _check(eager: nn.Module, loss_module: nn.Module, spec: Dict[str, Any], graphs: Dict[str, Any],
           state: Dict[str, Tensor], names: List[str], input_names: List[str], x: Dict[str, Tensor],
           y: Tensor) -> None:
    """The program (Python twin of the native interpreter) beside the eager model and torch.optim: two
    steps at the example's size, one at one more, then evaluate and forward in eval mode; bit for bit."""
    compare = self_check._Comparison("export")
    twin = program.Program(graphs, state, names, spec)
    optimizer = optim.torch_optimizer(spec, eager.parameters())
    eager.train()
    batches = [(x, y), (x, y), ({n: _grow(t) for n, t in x.items()}, _grow(y))]
    try:
        with torch.random.fork_rng(devices=[]):
            for k, (bx, by) in enumerate(batches):
                method = f"train_step {k + 1}"
                torch.manual_seed(self_check.SEED + k)
                optimizer.zero_grad()
                expected = loss_module(_call(eager, input_names, [bx[n] for n in input_names]), by)
                expected.backward()
                optimizer.step()
                torch.manual_seed(self_check.SEED + k)
                actual = twin.train_step(bx, by)
                compare.tensor(method, "loss", expected.detach(), actual)
                compare.named(method, "parameter", dict(eager.named_parameters()),
                              {n: twin.state[f"param:{n}"] for n in names})
                compare.named(method, "buffer", dict(eager.named_buffers()),
                              {n: twin.state[f"buffer:{n}"] for n, _ in eager.named_buffers()})
            eager.eval()
            with torch.no_grad():
                out = _call(eager, input_names, [x[n] for n in input_names])
                compare.tensor("forward", "output", out, twin.forward(x))
                compare.tensor("evaluate", "loss", loss_module(out, y), twin.evaluate(x, y))
    except ExportError:
        raise
    except Exception as ex:
        raise ExportError(messages.export_check_raised("train_step", " ".join(str(ex).split())[:300])) from ex
