"""The eager twin of an exported training module (``Reference``), which ``reference.train``, ``train_sharded``,
the online replay and the export's check train with.

``Reference`` starts from the module's own initial tensors (read from the .pt by name) and trains with the real
``torch.optim`` optimizer and ``torch.nn.functional`` loss named in the metadata, in torch.optim's order
``zero_grad; loss.backward(); step``. The model's forward is:

- the eager ``nn.Module`` you pass (the strongest check: no TorchScript on this side), or
- for the built-in ``linear-regression``, a fresh eager ``LinearRegression``, or
- otherwise the model stored in the .pt, run by the TorchScript interpreter (same aten ops,
  eager autograd; call it inside ``plain_graph_executor()``, which ``Reference`` does itself).

On a device other than the CPU (``device="cuda:0"``) the model, the loss and the optimizer state live there,
each batch is copied there as it steps, and torch.optim takes its single-tensor path (``foreach=False``,
what the exported optimizers copy; torch's default for CUDA tensors is the foreach path).
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from ._runtime import autocast, devices, inputs
from . import messages, protocol
from ._runtime import data as data_checks
from .errors import GradbridgeError, InvalidInputError, ProtocolError, TrainingError
from .spec import groups, losses, optim, schedulers
from .history import EpochRecord, digest
from .models import LinearRegression
from ._runtime import torchscript
from ._runtime.torchscript import plain_graph_executor
from ._runtime.program import read_program


def initial_state(model_path: str | os.PathLike) -> Dict[str, Tensor]:
    """The parameters and buffers stored in an exported module, by name."""
    if protocol.read_metadata(model_path)["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION:
        return _program_state(model_path)
    return _state_of(torchscript.load(str(model_path)))


def _program_state(model_path: str | os.PathLike) -> Dict[str, Tensor]:
    """A protocol-3 module's parameters and buffers, by name (read from its state entries)."""
    _, _, state = read_program(model_path)
    return {name.split(":", 1)[1]: t for name, t in state.items() if name.split(":", 1)[0] in ("param", "buffer")}


def _state_of(module: torch.jit.ScriptModule, clone: bool = True) -> Dict[str, Tensor]:
    names = module.parameter_names() + module.buffer_names()
    values = module.get_parameters() + module.get_buffers()  # copies already
    return {name: value.detach().clone() if clone else value.detach() for name, value in zip(names, values)}


def _as_numpy(tensors: Dict[str, Tensor]) -> Dict[str, np.ndarray]:
    return {name: t.detach().cpu().double().numpy().ravel().copy() for name, t in tensors.items()}


#: What torch raises for inputs a model cannot take (e.g. "Target 5 is out of bounds." for a label outside its
#: classes): the failures reference.train turns into one error.
_TORCH_FAILURES = (RuntimeError, IndexError, ValueError)


def _numpy(array: Any) -> np.ndarray:
    return array.detach().cpu().numpy() if isinstance(array, Tensor) else np.asarray(array)


def _is_seed_model(metadata: Dict[str, Any]) -> bool:
    """The built-in seed model (its eager class is known), not just any model of that name."""
    return metadata["model"] == "linear-regression" and [
        (p["name"], p["shape"]) for p in metadata["parameters"]] == [("weight", [1]), ("bias", [1])]


def _copy_state(model_path: str | os.PathLike, tensors: List[Tuple[str, Tensor]], state: Dict[str, Tensor]) -> None:
    """Copy the module's initial ``state`` into the user's model's ``tensors`` (its parameters and buffers by
    name), checked first to be this model's: the same names, the same shapes."""
    missing = sorted({name for name, _ in tensors} - set(state))
    if missing:
        raise ValueError(f"{model_path} has no values for {missing}: is it this model's export?")
    extra = sorted(set(state) - {name for name, _ in tensors})
    if extra:
        raise ValueError(f"{model_path} holds {extra}, which the given model lacks: is it this model's export?")
    for name, tensor in tensors:
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise ValueError(f"{model_path} holds {name} of shape {list(state[name].shape)}, the given "
                             f"model's {name} has shape {list(tensor.shape)}: is it this model's export?")
    with torch.no_grad():
        for name, tensor in tensors:
            tensor.copy_(state[name])


class Reference:
    """Eager torch.optim training of the model in ``model_path`` (see the module docstring)."""

    def __init__(self, model_path: str | os.PathLike, model: Optional[nn.Module] = None, *,
                 optimizer: Optional[Dict[str, Any]] = None, loaded: Optional[torch.jit.ScriptModule] = None,
                 state: Optional[Dict[str, Tensor]] = None, take_model: bool = False, device: str = devices.CPU):
        """``loaded``: the module at ``model_path`` already loaded, to read its initial state from (it
        is not loaded again); with ``model`` given, the reference does not use it after that.
        ``state``: the module's parameters and buffers by name, already read (``_program_state``; with ``model``,
        a TorchScript file is then not loaded). ``take_model``: train ``model`` itself, not a copy (the export's
        check hands over its copy). ``device``: where it trains (canonical, checked: ``devices.require``)."""
        self.metadata = protocol.read_metadata(model_path)
        self.path = str(model_path)
        self.device = device
        on_device = devices.is_cuda(device)
        program = self.metadata["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION
        if program and model is None:
            raise ProtocolError(messages.protocol3_needs_model(str(model_path)))
        # the model stored in the .pt is read onto the device (a trace's constants too)
        where = {"map_location": device} if on_device and model is None and loaded is None else {}
        scripted = None if program or (model is not None and state is not None) else \
            loaded if loaded is not None else torchscript.load(str(model_path), **where)
        if scripted is not None:
            protocol.check_parameters(str(model_path), self.metadata, scripted.parameter_names(),
                                      scripted.get_parameters())
        if model is None and _is_seed_model(self.metadata):
            model = LinearRegression()
        self.input_names = inputs.names(self.metadata)
        # The model in the .pt takes the inputs as the exported methods do (a list, for several).
        self._takes_list = model is None and not inputs.is_single(self.input_names)
        self._prefix = "model." if self._takes_list else ""
        if model is None:
            self.model: nn.Module = scripted.model
            # A traced model's eval-mode trace (modules exported before it have the one model).
            self.eval_model: nn.Module = getattr(scripted, "eval_model", scripted.model)
        else:
            self.model = self._users_model(model, model_path, scripted, state, program, take_model)
            self.eval_model = self.model
        self.model.train()
        self._build_loss(model)
        self._build_optimizer(model_path, optimizer)

    def _users_model(self, model: nn.Module, model_path: str | os.PathLike, scripted: Optional[torch.jit.ScriptModule],
                     state: Optional[Dict[str, Tensor]], program: bool, take_model: bool) -> nn.Module:
        """The user's eager ``model`` (itself with ``take_model``, else a copy) holding the module's initial
        parameters and buffers (``state``, else read from the module), on the reference's device."""
        unsupported = devices.off_device(model)
        if unsupported:
            raise InvalidInputError(unsupported)
        model = model if take_model else copy.deepcopy(model)
        if state is None:  # only read from here, so not copied
            state = _program_state(model_path) if program else _state_of(scripted, clone=False)
        tensors = list(model.named_parameters()) + list(model.named_buffers())
        _copy_state(model_path, tensors, state)
        if devices.is_cuda(self.device) or any(t.device.type != "cpu" for _, t in tensors):
            model.to(self.device)
        return model

    def _build_loss(self, model: Optional[nn.Module]) -> None:
        """The metadata's loss and autocast region: forward and loss under torch.autocast, as exported; ``model``:
        the user's, else None (the stored model holds its casts already: its loss alone)."""
        self.loss = losses.build(self.metadata["loss"])
        self.autocast = autocast.of(self.metadata)
        self._forward_autocast = None if model is None else self.autocast
        if devices.is_cuda(self.device):  # a loss's weights are plain tensor attributes, which Module.to leaves alone
            for name, value in list(vars(self.loss).items()):
                if isinstance(value, Tensor):
                    setattr(self.loss, name, value.to(self.device))

    def _build_optimizer(self, model_path: str | os.PathLike, optimizer: Optional[Dict[str, Any]]) -> None:
        """torch.optim's optimizer (``optimizer``, else the metadata's) on the trainable parameters, and the
        fine-tuning the metadata names: schedule, clipping, accumulation."""
        # Frozen parameters as exported (a scripted model does not keep requires_grad=False).
        frozen = {spec["name"] for spec in self.metadata["parameters"] if not spec.get("trainable", True)}
        for name, p in self.named_parameters():
            p.requires_grad_(name not in frozen)
        spec = optimizer or self.metadata["optimizer"]
        tuning = {} if optimizer is not None else self.metadata.get(protocol.FINE_TUNING_KEY, {})
        try:  # an edited file's fields, checked as the export checked them (torch would divide by zero)
            self.optimizer = optim.torch_optimizer({k: v for k, v in spec.items() if k != "groups"},
                                                   groups.torch_param_groups(spec, self.named_parameters()),
                                                   single_tensor=devices.is_cuda(self.device))
            if "scheduler" in tuning:
                schedulers.validate(tuning["scheduler"], len(self.optimizer.param_groups))
        except (ValueError, TypeError, KeyError) as ex:
            raise ProtocolError(f"{model_path}: {protocol.METADATA_FILE}: {messages.one_line(ex)}") from ex
        # An optimizer override (the seed's sgd_step lr) is not the module's: no lrs recorded then.
        self._records_lrs = optimizer is None
        self.scheduler = (schedulers.torch_scheduler(tuning["scheduler"], self.optimizer)
                          if "scheduler" in tuning else None)
        self.scheduler_interval = tuning.get("scheduler_interval", "none")
        self.clip = optim.clip_of({protocol.FINE_TUNING_KEY: tuning})
        self.accumulate = int(tuning.get("accumulate", 1))

    def _clip(self) -> None:
        """torch.nn.utils' clipping on the parameters, as the exported module does before a step."""
        if self.clip["kind"] == "norm":
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip["max"], self.clip["norm_type"])
        elif self.clip["kind"] == "value":
            torch.nn.utils.clip_grad_value_(self.model.parameters(), self.clip["max"])

    def lrs(self) -> List[float]:
        """Each parameter group's learning rate."""
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def end_epoch(self, metric: float) -> None:
        """The per-epoch schedule step (ReduceLROnPlateau with ``metric``), as ``schedule_epoch``."""
        if self.scheduler is None or self.scheduler_interval != "epoch":
            return
        if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.scheduler.step(metric)
        else:
            self.scheduler.step()

    def to_device(self, value: Any) -> Any:
        """A batch's tensor (or inputs by name) on the reference's device; itself on the CPU."""
        if not devices.is_cuda(self.device):
            return value
        if isinstance(value, dict):
            return {name: t.to(self.device) for name, t in value.items()}
        return value.to(self.device)

    def method_argument(self, x: inputs.Batch) -> Any:
        """``x`` as the exported module's methods take it (a tensor, or a list of the named inputs)."""
        return inputs.method_argument(x, self.input_names)

    def forward(self, model: nn.Module, x: inputs.Batch) -> Tensor:
        """``model`` (``self.model`` or ``self.eval_model``) on one batch's inputs."""
        return model(self.method_argument(x)) if self._takes_list else inputs.call(model, x)

    def loss_of(self, model: nn.Module, x: inputs.Batch, y: Tensor) -> Tensor:
        """The loss of ``model`` on (x, y): forward and loss under the module's autocast region, if any."""
        with autocast.region(self._forward_autocast):
            output = self.forward(model, x)
        with autocast.region(self.autocast):
            return self.loss(output, y)

    def backward(self, x: inputs.Batch, y: Tensor) -> Tensor:
        """zero_grad, then the loss on (x, y) and its backward; returns the loss (detached)."""
        with plain_graph_executor():
            self.optimizer.zero_grad()
            loss = self.loss_of(self.model, x, y)
            loss.backward()
        return loss.detach()

    def step(self) -> None:
        """Clipping, torch.optim's step and the per-step schedule, on the gradients there are."""
        with plain_graph_executor():
            self._clip()
            self.optimizer.step()
            if self.scheduler is not None and self.scheduler_interval == "step":
                self.scheduler.step()

    def train_step(self, x: inputs.Batch, y: Tensor) -> Tensor:
        """One torch.optim step on (x, y), copied to the device first; returns the loss (detached)."""
        x, y = self.to_device(x), self.to_device(y)
        if self.accumulate == 1:
            loss = self.backward(x, y)
        else:  # the eager accumulation loop: (loss / k).backward() per micro-batch, one step
            with plain_graph_executor():
                self.optimizer.zero_grad()
                size = (len(y) + self.accumulate - 1) // self.accumulate
                loss = None
                for xm, ym in zip(inputs.split(x, size), y.split(size)):
                    scaled = self.loss_of(self.model, xm, ym) / self.accumulate
                    scaled.backward()
                    loss = scaled.detach() if loss is None else loss + scaled.detach()
        self.step()
        return loss

    def sharded_step(self, x: inputs.Batch, y: Tensor, rows: Sequence[int], shards: int,
                     seeds: Optional[Sequence[int]] = None) -> float:
        """One synchronous data-parallel step on the global mini-batch ``rows`` (indices into x, y),
        as gradbridge-spark takes it on ``shards`` partitions; returns the step loss.

        Partition k holds the rows with ``i % shards == k``; its shard is the batch's rows it
        holds, in batch order. Each non-empty shard's mean loss is back-propagated from the same
        parameters and the same buffers, after ``torch.manual_seed(seeds[k])`` when ``seeds`` is given
        (its dropout masks); then ``combine_shards`` (the sample-weighted sum in partition order) gives
        each ``p.grad``, and torch.optim steps once (after clipping, as ``optimizer_step`` does). The
        buffers the step leaves are those of the first partition with rows (BatchNorm's statistics:
        DistributedDataParallel's ``broadcast_buffers`` from its first rank).
        """
        parameters = [p for _, p in self.named_parameters()]
        buffers = self.trained_buffers()
        start = [b.detach().clone() for b in buffers]  # every partition starts the step from these
        kept = None
        shard_results = []
        with plain_graph_executor():
            for k in range(shards):
                index = [i for i in rows if i % shards == k]
                if not index:
                    continue
                if kept is not None:  # an earlier partition's forward moved them
                    with torch.no_grad():
                        for b, value in zip(buffers, start):
                            b.copy_(value)
                if seeds is not None:
                    torch.manual_seed(seeds[k])
                self.optimizer.zero_grad()  # set_to_none: an unused parameter keeps no gradient
                selected = torch.tensor(index, dtype=torch.int64)
                loss = self.loss_of(self.model, inputs.select(x, selected), y.index_select(0, selected))
                loss.backward()
                shard_results.append((len(index), float(loss.detach()),
                                      [None if p.grad is None else p.grad.clone() for p in parameters]))
                if kept is None:
                    kept = [b.detach().clone() for b in buffers]
            with torch.no_grad():
                for b, value in zip(buffers, kept or start):
                    b.copy_(value)
            step_loss, combined = combine_shards(shard_results)
            for p, g in zip(parameters, combined):
                p.grad = g
        self.step()
        return step_loss

    def trained_buffers(self) -> List[Tensor]:
        """The buffers a training step writes (metadata ``trained``; every buffer in a module exported
        before that flag), in protocol order."""
        names = [b["name"] for b in self.metadata["buffers"] if b.get("trained", True)]
        mine = dict((name[len(self._prefix):], b) for name, b in self.model.named_buffers())
        return [mine[name] for name in names]

    def train_epoch(self, x: inputs.Batch, y: Tensor, perm: Tensor, batch_size: int) -> List[Tensor]:
        """``train_step`` on ``index_select(0, perm[i:i + batch_size])`` batches, as ``train_epoch`` does."""
        return [self.train_step(inputs.select(x, perm[i:i + batch_size]), y.index_select(0, perm[i:i + batch_size]))
                for i in range(0, len(perm), batch_size)]

    def evaluate(self, x: inputs.Batch, y: Tensor) -> Tensor:
        """The loss in eval mode without gradients; the model returns to training mode."""
        x, y = self.to_device(x), self.to_device(y)
        self.eval_model.eval()
        try:
            with torch.no_grad(), plain_graph_executor():
                return self.loss_of(self.eval_model, x, y)
        finally:
            self.eval_model.train()

    def refuses(self, batch: Dict[str, np.ndarray]) -> bool:
        """Whether ``evaluate`` fails inside torch on ``batch`` (each input by name, then y): the probe of
        ``data.out_of_range``, as Java's ``ValueRanges`` calls the module's ``evaluate``."""
        x, y = data_checks.tensors(self.metadata, {name: batch[name] for name in self.input_names}, batch[inputs.Y], "")
        try:
            self.evaluate(x[inputs.X] if inputs.is_single(self.input_names) else x, y)
            return False
        except _TORCH_FAILURES:
            return True

    def blame(self, failure: Exception, source: str, x: Any, y: Any, what: str) -> GradbridgeError:
        """The error for ``failure`` (torch's, while training or evaluating on ``x``, ``y`` from ``source``):
        the data's line when an array holds an id or label the model does not take (Java: ``ValueRanges.blame``),
        else a TrainingError naming the module, ``what`` failed and torch's reason."""
        given = inputs.arrays(x)
        arrays = {name: _numpy(given[name]) for name in self.input_names}
        arrays[inputs.Y] = _numpy(y)
        line = data_checks.out_of_range(self.refuses, source, arrays)
        if line is not None:
            return InvalidInputError(line)
        return TrainingError(f"{self.path}: {what}: {messages.torch_reason(failure)}")

    def named_parameters(self) -> List[tuple]:
        """The model's parameters by the model's names (the .pt's model of several inputs sits in
        ``capture.keyword_call``, under ``model.``)."""
        return [(name[len(self._prefix):], p) for name, p in self.model.named_parameters()]

    def parameters(self, copies: bool = True) -> Dict[str, Tensor]:
        """The parameters by name; ``copies=False``: the tensors themselves, detached (to compare at once)."""
        return {name: p.detach().clone() if copies else p.detach() for name, p in self.named_parameters()}

    def buffers(self, copies: bool = True) -> Dict[str, Tensor]:
        return {name[len(self._prefix):]: b.detach().clone() if copies else b.detach()
                for name, b in self.model.named_buffers()}

    def record(self, epoch: int, loss: float, val_loss: Optional[float], elapsed_s: float,
               with_values: bool = True) -> EpochRecord:
        """The History record of the parameters as they are now (values and digests)."""
        dtypes = {spec["name"]: spec["dtype"] for spec in self.metadata["parameters"]}
        parameters = self.parameters()
        return EpochRecord(epoch, loss, _as_numpy(parameters) if with_values else {}, val_loss=val_loss,
                           elapsed_s=elapsed_s,
                           digests={name: digest(value, dtypes[name]) for name, value in parameters.items()},
                           lrs=self.lrs() if self._records_lrs else None)

    def optimizer_state(self) -> Dict[str, List[Tensor]]:
        """torch.optim's per-parameter state as ``{key: [tensor per parameter]}`` (absent keys skipped)."""
        state: Dict[str, List[Tensor]] = {}
        # group order, as torch.optim's state_dict numbers them (frozen parameters have none)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for p in params:
            for key, value in self.optimizer.state[p].items():
                if torch.is_tensor(value):
                    state.setdefault(key, []).append(value.clone())
        return {key: values for key, values in state.items() if len(values) == len(params)}


def combine_shards(results: Sequence[tuple]) -> tuple:
    """The step gradient of data-parallel training: the sample-weighted sum of the shard
    gradients in partition order (Java: ``dev.gradbridge.spark.GradientCombiner``).

    ``results``: ``(rows, loss, gradients)`` per non-empty shard in partition order, each gradient
    a tensor or None (no gradient). With N the rows of all shards and ``w = rows / N`` (a Python
    float; torch rounds it to a float32 tensor's dtype): per parameter, over the shards that have a
    gradient for it, ``G = g * w`` for the first and ``G = G + g * w`` after, each op rounded to the
    dtype; None when no shard has one. The step loss is ``sum(w * loss)`` in float64, in order.
    """
    total = sum(rows for rows, _, _ in results)
    loss = None
    combined: List[Optional[Tensor]] = [None] * (len(results[0][2]) if results else 0)
    for rows, shard_loss, gradients in results:
        w = rows / total
        loss = w * shard_loss if loss is None else loss + w * shard_loss
        for i, g in enumerate(gradients):
            if g is not None:
                term = g.mul(w)
                combined[i] = term if combined[i] is None else combined[i].add(term)
    return loss, combined
