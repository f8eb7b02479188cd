"""``export_training_module(..., format="export")``: protocol 3, a training step captured as aten graphs.

The model and its loss are captured with ``torch.export.export(strict=False)``, then functorch's
``aot_export_module(..., trace_joint=True, output_loss_index=0, decompositions={})`` gives the joint
forward+backward graph (training mode; dropout's random mask in graph order on torch's generator): no
decomposition, and ``traceable.while_capturing`` keeps the trace on eager's kernels, so every op is the one
eager autograd calls. ``forward`` and the ``loss`` are captured in eval mode. The optimizer step is
torch.optim's single-tensor op sequence, written here op by op with the per-step Python doubles as host
scalars (``program.host_scalars``).

Shapes: each graph is captured at the example's batch size and at one more; the sizes that change between
the two become ``a * batch + c`` (``oplist.batch_affine``), anything else that changes is refused. A batch of
one sample is one torch.export specializes on (size 1 broadcasts), so ``train``, ``forward`` and ``loss``
are captured once more at one sample as graphs of their own (``NAME@1``, ``program.ONE``); a model that
cannot run one sample (eager refuses too, e.g. BatchNorm in training) gets none and ``min_batch`` 2. The
check then runs the program (``program.Program``, the native interpreter's twin) beside the user's eager
model and torch.optim, bit for bit, at every size it holds, before the file is written.

The file: a zip of ``gradbridge.json`` (protocol 3; ``program`` names the graphs and the state), one op
list per graph (``graphs/NAME.json``) and the state tensors (``state/K.bin``, raw little-endian bytes).
"""

from __future__ import annotations

import itertools
import json
import logging
import warnings
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .._runtime import autocast, inputs as model_inputs, libtorch, oplist, program
from .. import messages, protocol
from .._version import __version__
from ..errors import ExportError
from .._runtime.files import atomic_path
from ..spec import losses
from . import capture as model_capture, check_trail, finetune, protocol3_check, protocol3_optimizer, step_writes
from . import traceable, weights

log = logging.getLogger(__name__)


class _Step(nn.Module):
    """The model then its loss, over positional tensors (the inputs in order, then y); with ``accumulate``
    k > 1 the loss divided by k, as eager's accumulation loop back-propagates it."""

    def __init__(self, model: nn.Module, loss: nn.Module, names: Sequence[str], accumulate: int = 1,
                 autocast_dtype: Optional[str] = None):
        super().__init__()
        self.m = model
        self.loss = loss
        self.names = list(names)
        self.accumulate = accumulate
        self.autocast = autocast_dtype

    def forward(self, *args: Tensor) -> Tuple[Tensor]:
        *xs, y = args
        with autocast.region(self.autocast):
            loss = self.loss(_call(self.m, self.names, xs), y)
        return (loss if self.accumulate == 1 else loss / self.accumulate,)


class _Forward(nn.Module):
    def __init__(self, model: nn.Module, names: Sequence[str], autocast_dtype: Optional[str] = None):
        super().__init__()
        self.m = model
        self.names = list(names)
        self.autocast = autocast_dtype

    def forward(self, *xs: Tensor) -> Tuple[Tensor]:
        with autocast.region(self.autocast):
            return (_call(self.m, self.names, xs),)


class _Loss(nn.Module):
    def __init__(self, loss: nn.Module, autocast_dtype: Optional[str] = None):
        super().__init__()
        self.loss = loss
        self.autocast = autocast_dtype

    def forward(self, output: Tensor, y: Tensor) -> Tuple[Tensor]:
        with autocast.region(self.autocast):
            return (self.loss(output, y),)


def _call(model: nn.Module, names: Sequence[str], xs: Sequence[Tensor]) -> Tensor:
    return model(xs[0]) if model_inputs.is_single(names) else model(**dict(zip(names, xs)))


def _strip(name: str) -> str:
    return name[2:] if name.startswith("m.") else name


def _capture(module: nn.Module, args: Tuple[Tensor, ...], joint: bool, input_bindings: List[str],
             constants: Dict[str, Tensor], result: str = "output") -> Dict[str, Any]:
    """One graph as an op list."""
    from torch._functorch.aot_autograd import aot_export_module

    try:
        # eager evaluates and predicts under no_grad, where a model may take another path (a
        # TransformerEncoderLayer's native fast path): the eval graphs are captured so too
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), traceable.while_capturing() as functions, \
                torch.set_grad_enabled(joint):
            # torch.export's unlifting warns about the constants it re-attaches; they are lifted to state below
            warnings.filterwarnings("ignore", message=".*get_attr.*", category=UserWarning)
            # newer torches: a recurrent layer re-reads its parameters into _flat_weights at each call;
            # torch.export puts the user's parameters back after the trace
            warnings.filterwarnings("ignore", message="The tensor attributes .*_flat_weights.* were assigned during "
                                    "export", category=UserWarning)
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
        outputs += [f"grad:{_strip(n)}" for n in signature.backward_signature.gradients_to_parameters.values()]
    else:
        outputs.append(result)
    return oplist.from_fx(gm.graph, bindings, outputs)


def _without_gradient(model: nn.Module, loss: nn.Module, names: Sequence[str], args: Tuple[Tensor, ...],
                      trainable: List[str], autocast_dtype: Optional[str]) -> List[str]:
    """The trainable parameters the loss gives no gradient (autograd's None), from one eager backward of the
    export's copy (``torch.autograd.grad``: no ``.grad`` set; its buffers put back, the generator left as it
    was): torch.optim skips such a parameter at every step (its ``.grad`` stays None), so the step graph
    leaves it out. The set is the graph's: a model whose reach depends on its data is refused by the capture."""
    wanted = dict(model.named_parameters())
    saved = [(module, name, b, b.detach().clone()) for module in model.modules() for name, b in module._buffers.items()
             if b is not None]
    try:
        with torch.random.fork_rng(devices=[]):
            value = _Step(model, loss, names, autocast_dtype=autocast_dtype).train()(*args)[0]
            if not value.requires_grad:
                return list(trainable)
            grads = torch.autograd.grad(value, [wanted[n] for n in trainable], allow_unused=True)
            return [n for n, g in zip(trainable, grads) if g is None]
    except Exception as ex:  # the user's model fails: the capture would say the same
        raise ExportError(messages.aten_capture_failed(type(model).__name__, traceable.capture_failure(ex))) from ex
    finally:
        with torch.no_grad():
            for module, name, buffer, before in saved:  # each buffer's own tensor, its values as before
                buffer.copy_(before)
                module._buffers[name] = buffer


def _graph_at_two_sizes(make: Any, args: Tuple[Tensor, ...], joint: bool, bindings: List[str],
                        constants: Dict[str, Tensor], name: str, result: str = "output") -> Dict[str, Any]:
    b = int(args[0].shape[0])
    small = _capture(make(), args, joint, bindings, constants, result)
    large = _capture(make(), tuple(protocol3_check.grow(a) for a in args), joint, bindings, constants, result)
    try:
        return oplist.batch_affine(small, large, b, b + 1, name)
    except oplist.OpListError as ex:
        raise ExportError(messages.aten_batch_dependent(str(ex))) from ex


def _one_sample_graphs(model: nn.Module, loss: nn.Module, names: Sequence[str], xs: Tuple[Tensor, ...], y: Tensor,
                       bindings: List[str], constants: Dict[str, Tensor], accumulate: int,
                       autocast_dtype: Optional[str]) -> Dict[str, Any]:
    """``train`` (and ``train_accumulate``), ``forward`` and ``loss`` captured at one sample (``NAME@1``), or
    none when the model cannot be captured at one (then protocol 3 runs batches, and micro-batches, of
    ``program.MIN_BATCH`` or more); leaves the model in training mode."""
    one, target = tuple(t[:1] for t in xs), y[:1]
    made = dict(constants)  # a failed capture adds none
    graphs: Dict[str, Any] = {}
    try:
        model.train()
        graphs[program.one("train")] = _capture(_Step(model, loss, names, 1, autocast_dtype).train(), (*one, target),
                                                True, bindings + ["target"], made)
        if accumulate > 1:
            graphs[program.one("train_accumulate")] = _capture(
                _Step(model, loss, names, accumulate, autocast_dtype).train(), (*one, target), True,
                bindings + ["target"], made)
        model.eval()
        graphs[program.one("forward")] = _capture(_Forward(model, names, autocast_dtype).eval(), one, False, bindings,
                                                  made)
        with torch.no_grad():
            output = _Forward(model, names, autocast_dtype)(*one)[0]
        graphs[program.one("loss")] = _capture(_Loss(loss, autocast_dtype).eval(), (output, target), False,
                                               ["output", "target"], made, "loss")
    except ExportError as ex:
        log.info("no graphs at one sample: %s", ex)
        return {}
    finally:
        model.train()
    constants.update(made)
    return graphs


def capture_probe() -> int:
    """A one-layer model's training step captured as every export captures one (`gradbridge doctor`): the
    number of ops in its op list; ExportError when this torch cannot."""
    model = nn.Linear(2, 1)
    graph = _capture(_Step(model, nn.MSELoss(), [model_inputs.X]).train(), (torch.ones(2, 2), torch.ones(2, 1)),
                        True, [f"input:{model_inputs.X}", "target"], {})
    return len(graph["nodes"])


#: Bytes of a tensor written to the archive at a time (a chunk, not a copy of the tensor).
_CHUNK = 1 << 24


def _write_tensor(archive: zipfile.ZipFile, name: str, t: Tensor) -> None:
    """The tensor's bytes streamed into the archive entry ``name``, stored (random weights do not deflate),
    from the tensor's own memory; a non-contiguous tensor is copied once, that tensor alone."""
    data = memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    with archive.open(info, "w", force_zip64=len(data) >= zipfile.ZIP64_LIMIT) as entry:
        for start in range(0, len(data), _CHUNK):
            entry.write(data[start:start + _CHUNK])


def _micro_batches(batch: int, accumulate: int) -> List[int]:
    size = -(-batch // accumulate)
    return [min(size, batch - start) for start in range(0, batch, size)]


def export(model: nn.Module, loss: Any, optimizer: Any, path: Path, *, example_inputs: Any, model_name: Any,
           check: bool, options: Dict[str, Any], auto_reason: Optional[str] = None,
           exported_from: Optional[str] = None) -> Path:
    """See ``export_training_module`` (format="export") and this module's docstring. ``auto_reason``: why
    format="auto" did not take TorchScript, ``exported_from``: the device of a model not on the CPU (both
    recorded in the metadata's ``capture``); the capture runs on a CPU copy of the model."""
    if options.get("inputs") is not None or example_inputs is None:
        raise ExportError(messages.aten_option_refused("inputs without example_inputs"))
    if not isinstance(example_inputs, (tuple, list)) or len(example_inputs) != 2 \
            or not isinstance(example_inputs[1], Tensor):
        raise ValueError("example_inputs must be (x, y) with y a tensor")
    loss_module, loss_spec = losses.resolve(loss)
    input_names, example_x = model_inputs.of_example(model, example_inputs[0])
    x = model_inputs.arrays(example_x)
    y = example_inputs[1]
    batch = int(y.shape[0])
    if batch < program.MIN_BATCH:
        raise ExportError(messages.aten_batch_too_small(batch, program.MIN_BATCH))
    metadata, graphs, state, schedule = _build(model, loss_module, loss_spec, optimizer, input_names, example_x, x, y,
                                               model_name=model_name, check=check, options=options,
                                               auto_reason=auto_reason, exported_from=exported_from)
    path = Path(path)
    with atomic_path(path) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(protocol.METADATA_FILE, json.dumps(metadata, indent=2))
            for name, graph in graphs.items():
                archive.writestr(f"graphs/{name}.json", json.dumps(graph, separators=(",", ":")))
            for entry, tensor in zip(metadata[protocol.PROGRAM_KEY]["state"], state.values()):
                _write_tensor(archive, entry["file"], tensor)
        # The state holds the export's copy of the model and its optimizer state (the capture went with
        # _build's frame): let go, so the check holds one side at a time beside the user's model.
        del state
        if check:
            check_trail.release()
            protocol3_check.check(tmp, model, schedule, input_names, x, y, one_sample=program.one("train") in graphs,
                             init_weights=options.get("init_weights"))
    log.info("wrote %s", path)
    return path


def _build(model: nn.Module, loss_module: nn.Module, loss_spec: Dict[str, Any], optimizer: Any,
           input_names: List[str], example_x: Any, x: Dict[str, Tensor], y: Tensor, *, model_name: Any, check: bool,
           options: Dict[str, Any], auto_reason: Optional[str],
           exported_from: Optional[str]) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Tensor], Any]:
    """The graphs of a copy of ``model``, the state to write (that copy's tensors and the optimizer's, not
    copied), the metadata and the schedule module."""
    names_by_id = {id(p): n for n, p in model.named_parameters()}  # the user's (the optimizer holds those)
    model = model_capture.cpu_copy(model)
    named = list(model.named_parameters())
    if not named:
        raise ValueError(f"{type(model).__name__} has no parameters: nothing to train")
    names = [n for n, _ in named]
    setup = finetune.setup(named, names_by_id, optimizer, freeze=options.get("freeze", ()),
                           scheduler=options.get("scheduler"), scheduler_interval=options.get("scheduler_interval", "step"),
                           clip_grad_norm=options.get("clip_grad_norm"), clip_norm_type=options.get("clip_norm_type", 2.0),
                           clip_grad_value=options.get("clip_grad_value"), accumulate=options.get("accumulate", 1))
    training, counters, schedule = protocol3_optimizer.training_spec(setup, names)
    setup.optimizers.clear()  # their state is built again at the write (protocol3_optimizer.initial_state)
    accumulate = setup.plan.accumulate
    if options.get("init_weights") is not None:
        finetune.load_weights(model, options["init_weights"])
    writes = step_writes.probe(model, example_x)
    xs = tuple(x[n] for n in input_names)
    constants: Dict[str, Tensor] = {}

    cast = options.get("autocast")  # forward and loss under torch.autocast("cpu", dtype=cast)
    graphs, idle = _graphs(model, loss_module, input_names, named, xs, y, cast, accumulate, constants)
    protocol3_optimizer.drop_from_groups(training, idle)
    if setup.plan.clip["kind"] != "none":
        graphs["clip"] = protocol3_optimizer.clip_graph([(n, p) for n, p in named if p.requires_grad and n not in idle],
                                                        setup.plan.clip)
    graphs.update(protocol3_optimizer.optimizer_graphs(training, {n: p.dtype for n, p in named}))
    state = _state(model, named, setup, training, idle, constants, graphs)
    metadata = _metadata(model, named, x, y, loss_spec, setup, writes, model_name=model_name,
                         capture={"kind": "export", "checked": check, protocol.DRAWS_RANDOM_KEY: writes.draws_random,
                                  **({protocol.AUTOCAST_KEY: cast} if cast else {}),
                                  **({protocol.AUTO_REASON_KEY: auto_reason} if auto_reason else {}),
                                  **({protocol.EXPORTED_FROM_KEY: exported_from} if exported_from else {})})
    entries = [{"name": name, "dtype": protocol.dtype_name(t.dtype), "shape": list(t.shape), "file": f"state/{i}.bin"}
               for i, (name, t) in enumerate(state.items())]
    metadata[protocol.PROGRAM_KEY] = {
        "oplist_version": oplist.VERSION,
        "min_batch": 1 if program.one("train") in graphs else program.MIN_BATCH,
        "graphs": {name: f"graphs/{name}.json" for name in graphs}, "state": entries,
        "training": training, "counters": counters}
    return metadata, graphs, state, schedule


def _graphs(model: nn.Module, loss_module: nn.Module, input_names: List[str], named: List[Tuple[str, nn.Parameter]],
            xs: Tuple[Tensor, ...], y: Tensor, cast: Optional[str], accumulate: int,
            constants: Dict[str, Tensor]) -> Tuple[Dict[str, Any], List[str]]:
    """The model's graphs (train at two sizes and at one sample, forward, loss), and the trainable parameters
    that get no gradient (``idle``: left out of the optimizer's groups, as torch.optim skips them)."""
    batch = int(y.shape[0])
    trainable = [n for n, p in named if p.requires_grad]
    input_bindings = [f"input:{n}" for n in input_names]
    model.train()
    idle = _without_gradient(model, loss_module, input_names, (*xs, y), trainable, cast)
    if idle == trainable:
        raise ExportError(messages.aten_no_gradient(type(model).__name__))
    params = dict(named)
    for n in idle:  # aot_export_module asserts a gradient for every parameter that requires one
        params[n].requires_grad_(False)
    graphs: Dict[str, Any] = {}
    graphs["train"] = _graph_at_two_sizes(lambda: _Step(model, loss_module, input_names, 1, cast).train(), (*xs, y),
                                          True, input_bindings + ["target"], constants, "train")
    if accumulate > 1:
        graphs["train_accumulate"] = _graph_at_two_sizes(
            lambda: _Step(model, loss_module, input_names, accumulate, cast).train(), (*xs, y), True,
            input_bindings + ["target"], constants, "train_accumulate")
    model.eval()
    graphs["forward"] = _graph_at_two_sizes(lambda: _Forward(model, input_names, cast).eval(), xs, False,
                                            input_bindings, constants, "forward")
    with torch.no_grad():
        output = _Forward(model, input_names, cast)(*xs)[0]
    graphs["loss"] = _graph_at_two_sizes(lambda: _Loss(loss_module, cast).eval(), (output, y), False,
                                         ["output", "target"], constants, "loss", "loss")
    graphs.update(_one_sample_graphs(model, loss_module, input_names, xs, y, input_bindings, constants, accumulate,
                                     cast))
    for size in (batch, batch + 1):  # a micro-batch of one runs train_accumulate@1, where the model has one
        micro = _micro_batches(size, accumulate)
        if accumulate > 1 and min(micro) < program.MIN_BATCH and program.one("train") not in graphs:
            raise ExportError(messages.aten_micro_batches_too_small(size, accumulate, micro, program.MIN_BATCH))
    model.train()
    for n in idle:
        params[n].requires_grad_(True)
    return graphs, idle


def _state(model: nn.Module, named: List[Tuple[str, nn.Parameter]], setup: Any, training: Dict[str, Any],
           idle: List[str], constants: Dict[str, Tensor], graphs: Dict[str, Any]) -> Dict[str, Tensor]:
    """The tensors to write: the model's own, as they are (not copied: nothing runs the model before the write),
    its constants and the optimizer's initial state; every tensor a graph binds is among them."""
    params = dict(named)
    state: Dict[str, Tensor] = {f"param:{n}": p.detach() for n, p in named}
    state.update({f"buffer:{n}": b.detach() for n, b in model.named_buffers()})
    state.update(constants)
    state.update({k: v for k, v in protocol3_optimizer.initial_state(setup, named).items() if k.split(":")[2] not in idle})
    if training["optimizer"] == "rmsprop":  # a momentum OneCycleLR set: torch's first step makes zero buffers
        for group in training["groups"]:
            for n in group["params"] if group["momentum"] > 0 else ():
                state.setdefault(f"state:momentum_buffer:{n}", torch.zeros_like(params[n].detach()))
    bound = {b for g in graphs.values() for b in g["inputs"]}
    for name in bound:
        if name.split(":")[0] in ("param", "buffer", "const") and name not in state:
            raise ExportError(messages.aten_unbound(name))
    return state


def _metadata(model: nn.Module, named: List[Tuple[str, nn.Parameter]], x: Dict[str, Tensor], y: Tensor,
              loss_spec: Dict[str, Any], setup: Any, writes: Any, *, model_name: Any,
              capture: Dict[str, Any]) -> Dict[str, Any]:
    """The file's ``gradbridge.json`` but its program: the model's tensors, loss, optimizer, inputs, capture."""
    specs = [protocol.example_spec(n, t) for n, t in x.items()] + [protocol.example_spec("y", y)]
    persistent = model.state_dict(keep_vars=True)
    metadata = protocol.build_metadata(
        model=model_name or type(model).__name__,
        parameters=[{**protocol.tensor_spec(n, p.shape, protocol.dtype_name(p.dtype), kind="parameter"), "trainable": p.requires_grad}
                    for n, p in named],
        buffers=[protocol.buffer_spec(n, b.shape, protocol.dtype_name(b.dtype), n in persistent, n in writes.trained_buffers)
                 for n, b in model.named_buffers()],
        loss=loss_spec, optimizer=setup.spec, inputs=specs, torch_version=libtorch.torch_version(),
        gradbridge_version=__version__, protocol_version=protocol.EXPORT_PROTOCOL_VERSION,
        methods=protocol.PROTOCOL3_METHODS, weights=weights.record(model),
    )
    if setup.plan.metadata:
        metadata[finetune.METADATA_KEY] = setup.plan.metadata
    metadata[protocol.CAPTURE_KEY] = capture
    return metadata
