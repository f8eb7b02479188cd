"""The eager-PyTorch reference: the same training as the Java run, done with torch.optim.

``Reference`` is the eager twin of an exported training module: it starts from the module's own
initial tensors (read from the .pt by name) and trains with the real ``torch.optim`` optimizer
and ``torch.nn.functional`` loss named in the metadata, in torch.optim's order
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
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ._runtime import devices, inputs, shuffle
from . import messages, protocol
from ._runtime import shuffle as shuffle_module
from ._runtime import data as data_checks
from .errors import DivergenceError, GradbridgeError, InvalidInputError, ProtocolError, TrainingError
from .export import capture, finetune, groups, losses, optim, schedulers
from .history import EpochRecord, History, digest, epoch_loss
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
            unsupported = capture.off_device(model)
            if unsupported:
                raise InvalidInputError(unsupported)
            self.model = model if take_model else copy.deepcopy(model)
            if state is None:  # only read from here, so not copied
                state = _program_state(model_path) if program else _state_of(scripted, clone=False)
            tensors = list(self.model.named_parameters()) + list(self.model.named_buffers())
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
            if on_device or any(t.device.type != "cpu" for _, t in tensors):
                self.model.to(device)
            self.eval_model = self.model
        self.model.train()
        self.loss = losses.build(self.metadata["loss"])
        if on_device:  # a loss's weights are plain tensor attributes, which Module.to leaves alone
            for name, value in list(vars(self.loss).items()):
                if isinstance(value, Tensor):
                    setattr(self.loss, name, value.to(device))
        # Frozen parameters as exported (a scripted model does not keep requires_grad=False).
        frozen = {spec["name"] for spec in self.metadata["parameters"] if not spec.get("trainable", True)}
        for name, p in self.named_parameters():
            p.requires_grad_(name not in frozen)
        spec = optimizer or self.metadata["optimizer"]
        tuning = {} if optimizer is not None else self.metadata.get(finetune.METADATA_KEY, {})
        try:  # an edited file's fields, checked as the export checked them (torch would divide by zero)
            self.optimizer = optim.torch_optimizer({k: v for k, v in spec.items() if k != "groups"},
                                                   groups.torch_param_groups(spec, self.named_parameters()),
                                                   single_tensor=on_device)
            if "scheduler" in tuning:
                schedulers.validate(tuning["scheduler"], len(self.optimizer.param_groups))
        except (ValueError, TypeError, KeyError) as ex:
            raise ProtocolError(f"{model_path}: {protocol.METADATA_FILE}: {messages.one_line(ex)}") from ex
        # An optimizer override (the seed's sgd_step lr) is not the module's: no lrs recorded then.
        self._records_lrs = optimizer is None
        self.scheduler = (schedulers.torch_scheduler(tuning["scheduler"], self.optimizer)
                          if "scheduler" in tuning else None)
        self.scheduler_interval = tuning.get("scheduler_interval", "none")
        self.clip = finetune.clip_of({finetune.METADATA_KEY: tuning})
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

    def backward(self, x: inputs.Batch, y: Tensor) -> Tensor:
        """zero_grad, then the loss on (x, y) and its backward; returns the loss (detached)."""
        with plain_graph_executor():
            self.optimizer.zero_grad()
            loss = self.loss(self.forward(self.model, x), y)
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
                    scaled = self.loss(self.forward(self.model, xm), ym) / self.accumulate
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
                loss = self.loss(self.forward(self.model, inputs.select(x, selected)), y.index_select(0, selected))
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
                return self.loss(self.forward(self.eval_model, x), y)
        finally:
            self.eval_model.train()

    def refuses(self, batch: Dict[str, np.ndarray]) -> bool:
        """Whether ``evaluate`` fails inside torch on ``batch`` (each input by name, then y): the probe of
        ``data.out_of_range``, as Java's ``ValueRanges`` calls the module's ``evaluate``."""
        x = {name: torch.from_numpy(batch[name]) for name in self.input_names}
        try:
            self.evaluate(x[inputs.X] if inputs.is_single(self.input_names) else x, torch.from_numpy(batch[inputs.Y]))
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


def shards_sha256(x, y, shards: int) -> str:
    """A gradbridge-spark checkpoint's ``shards_sha256``: SHA-256 over each partition's SHA-256 of its
    x bytes (``x`` a dict: each input's, in the dict's order, which is to be the module's) then its y
    bytes (partition p holds rows p, p + K, ... in order), in partition order.
    (``data_sha256`` of a single-process run is SHA-256 of all x bytes then all y bytes.)"""
    import hashlib

    outer = hashlib.sha256()
    for p in range(shards):
        inner = hashlib.sha256()
        for array in [*inputs.arrays(x).values(), y]:
            inner.update(np.ascontiguousarray(np.asarray(array)[p::shards]).tobytes())
        outer.update(inner.digest())
    return outer.hexdigest()


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


def check_data_parallel(model_path: str | os.PathLike, metadata: Dict[str, Any]) -> None:
    """What gradbridge-spark refuses (same lines): a protocol-1 module, trained buffers without
    ``set_state`` (exported before it), accumulation."""
    missing = [m for m in protocol.DATA_PARALLEL_METHODS if m not in metadata["methods"]]
    if missing:
        raise ProtocolError(messages.data_parallel_methods(str(model_path), metadata["protocol_version"], missing))
    trained = [b["name"] for b in metadata["buffers"] if b.get("trained", True)]
    if trained and protocol.SET_STATE not in metadata["methods"]:
        raise ProtocolError(messages.data_parallel_buffers(str(model_path), trained))
    accumulate = int(metadata.get(finetune.METADATA_KEY, {}).get("accumulate", 1))
    if accumulate != 1:
        raise ValueError(messages.data_parallel_accumulate(str(model_path), accumulate))


#: libtorch's intra-op threads of a gradbridge-spark task on Spark's defaults (``spark.task.cpus``, 1,
#: and ``spark.gradbridge.threads`` unset): what the replay runs on unless told otherwise.
TASK_THREADS = 1


def train_sharded(model_path: str | os.PathLike, x: Any, y: np.ndarray, *, epochs: int, shards: int,
                  batch_size: int = protocol.DEFAULT_BATCH_SIZE, seed: int = protocol.DEFAULT_SEED, shuffle: bool = True,
                  model: Optional[nn.Module] = None,
                  start_epoch: int = 0, record_values: bool = True, threads: Optional[int] = None) -> History:
    """The Python replay of a gradbridge-spark run on ``shards`` partitions (``Reference.sharded_step``).

    ``x``: the inputs, an array, or for a model of several inputs a dict of arrays by input name.
    Each epoch takes ``shuffle.permutation(seed, epoch, n)`` (or ``0..n-1`` without shuffling) in
    global mini-batches of ``batch_size``; the epoch loss is the mean of the step losses, as in ``train``.
    Partition k's forward and backward of the run's step s (``epoch * steps_per_epoch`` plus the step's
    index in the epoch) seed torch with ``shuffle.step_seed(seed, s, k)`` (dropout's draws); the buffers
    a step leaves are its first partition's with rows (``sharded_step``). libtorch runs on ``threads``
    intra-op threads, the tasks' count, which the run's history records per epoch
    (``EpochRecord.threads``; default ``TASK_THREADS``, Spark's defaults), as a few kernels' bits depend
    on it; the caller's count is restored after, and a change is said in one line on stderr.
    """
    epochs = messages.check_integer("epochs", epochs, 1, messages.INT_MAX)
    shards = messages.check_integer("shards", shards, 1, messages.INT_MAX)
    start_epoch = messages.check_integer("start_epoch", start_epoch, 0, messages.INT_MAX - epochs)
    seed = messages.check_integer("seed", seed, -(1 << 63), (1 << 64) - 1)
    threads = messages.check_integer("threads", TASK_THREADS if threads is None else threads, 1, messages.MAX_THREADS)
    check_data_parallel(model_path, protocol.read_metadata(model_path))
    xs, ys = inputs.to_torch(x), torch.from_numpy(np.ascontiguousarray(y))
    n = len(ys)
    if n == 0:
        raise InvalidInputError(messages.empty_dataset("training data"))
    if not 1 <= batch_size <= n:
        raise InvalidInputError(messages.batch_size(n, batch_size))
    if shards > n:
        raise InvalidInputError(f"{n} rows cannot fill {shards} partitions")
    reference = Reference(model_path, model)
    history = History()
    steps = (n + batch_size - 1) // batch_size
    previous = torch.get_num_threads()
    if previous != threads:
        print(messages.replay_threads(threads, previous), file=sys.stderr)
    torch.set_num_threads(threads)
    try:
        started = time.perf_counter()
        for epoch in range(start_epoch, start_epoch + epochs):
            order = shuffle_module.permutation(seed, epoch, n) if shuffle else list(range(n))
            first = epoch * steps  # the run's step number of the epoch's first step
            try:
                values = [reference.sharded_step(xs, ys, order[i:i + batch_size], shards,
                                                 [shuffle_module.step_seed(seed, first + i // batch_size, k)
                                                  for k in range(shards)])
                          for i in range(0, n, batch_size)]
            except _TORCH_FAILURES as ex:  # gradbridge-spark refuses such data before its first step
                raise reference.blame(ex, "training data", x, y, f"training step failed at epoch {epoch}") from ex
            for index, value in enumerate(values):
                if math.isnan(value) or math.isinf(value):
                    row = index * batch_size
                    error = DivergenceError(f"{messages.divergence(value, epoch, index, row, min(n, row + batch_size) - 1)}; "
                                            f"{len(history)} completed epoch(s) kept in error.history")
                    error.history = history
                    raise error
            reference.end_epoch(epoch_loss(values))
            record = reference.record(epoch, epoch_loss(values), None, time.perf_counter() - started, record_values)
            record.threads = threads
            history.append(record)
    finally:
        torch.set_num_threads(previous)
    history.buffers = _as_numpy(reference.buffers())
    return history


def train(model_path: str | os.PathLike, x: Any, y: np.ndarray, *, epochs: int,
          batch_size: int = protocol.DEFAULT_BATCH_SIZE, seed: int = protocol.DEFAULT_SEED,
          mode: str = protocol.DEFAULT_MODE, val: Optional[tuple] = None, model: Optional[nn.Module] = None,
          start_epoch: int = 0, record_values: bool = True, lr: Optional[float] = None,
          source: str = "training data", val_source: str = "validation data",
          device: Optional[str] = None, deterministic: bool = True) -> History:
    """Train like the Java ``Trainer``, in eager PyTorch; returns the History in the same schema.

    ``x``: the inputs, an array, or for a model of several inputs a dict of arrays by input name.
    Each epoch seeds torch with ``shuffle.torch_seed(seed, epoch)``; ``full`` mode takes one step
    on all data, ``step`` and ``fused`` (the same arithmetic here) step through
    ``shuffle.permutation(seed, epoch, n)`` in batches of ``batch_size``. ``val`` = (x, y) adds
    the validation loss after each epoch. ``start_epoch`` numbers the epochs of a continued run.
    ``lr`` sets every parameter group's learning rate first (Java: ``TrainingModule.setLr``).
    ``device``: ``cpu`` (None: the same), ``cuda`` or ``cuda:N`` (see ``Reference``), with torch's
    deterministic algorithms on for the run unless ``deterministic`` is false (``devices.deterministic``);
    each record then names the device and that setting.
    Raises DivergenceError at the first NaN or infinite batch loss; a step or validation loss torch refuses
    is an InvalidInputError naming ``source`` (or ``val_source``) and the array when the data holds an id or
    label the model does not take (``data.out_of_range``), else a TrainingError naming the module.
    """
    if mode not in protocol.MODES:
        raise InvalidInputError(messages.unknown_mode(mode))
    epochs = messages.check_integer("epochs", epochs, 1, messages.INT_MAX)
    start_epoch = messages.check_integer("start_epoch", start_epoch, 0, messages.INT_MAX - epochs)
    seed = messages.check_integer("seed", seed, -(1 << 63), (1 << 64) - 1)
    xs, ys = inputs.to_torch(x), torch.from_numpy(np.ascontiguousarray(y))
    n = len(ys)
    if n == 0:  # the words of java.train and of a data file's check
        raise InvalidInputError(messages.empty_dataset("training data"))
    batch = n if mode == "full" else batch_size
    if not 1 <= batch <= n:
        raise InvalidInputError(messages.batch_size(n, batch))
    device = devices.require(devices.CPU if device is None else device)
    with devices.deterministic(device, deterministic):
        return _train(model_path, xs, ys, n, epochs=epochs, batch=batch, seed=seed, mode=mode, val=val, model=model,
                      start_epoch=start_epoch, record_values=record_values, lr=lr, device=device,
                      deterministic=deterministic, source=source, val_source=val_source)


def _train(model_path: str | os.PathLike, xs: Any, ys: Tensor, n: int, *, epochs: int, batch: int, seed: int,
           mode: str, val: Optional[tuple], model: Optional[nn.Module], start_epoch: int, record_values: bool,
           lr: Optional[float], device: str, deterministic: bool, source: str, val_source: str) -> History:
    """``train``'s epochs, its arguments checked."""
    reference = Reference(model_path, model, device=device)
    if lr is not None:
        for group in reference.optimizer.param_groups:
            group["lr"] = lr
    history = History()
    started = time.perf_counter()
    for epoch in range(start_epoch, start_epoch + epochs):
        torch.manual_seed(shuffle.torch_seed(seed, epoch))
        try:
            if mode == "full":
                losses = [reference.train_step(xs, ys)]
            else:
                perm = torch.tensor(shuffle.permutation(seed, epoch, n), dtype=torch.int64)
                losses = reference.train_epoch(xs, ys, perm, batch)
        except _TORCH_FAILURES as ex:
            # e.g. "Target 5 is out of bounds." for a label outside the model's classes: the data's line
            raise reference.blame(ex, source, xs, ys, f"training step failed at epoch {epoch}") from ex
        values = [float(loss) for loss in losses]
        for index, value in enumerate(values):
            if math.isnan(value) or math.isinf(value):
                first = index * batch
                error = DivergenceError(f"{messages.divergence(value, epoch, index, first, min(n, first + batch) - 1)}; "
                                        f"{len(history)} completed epoch(s) kept in error.history")
                error.history = history  # every epoch before the divergent one
                raise error
        val_loss = None
        if val is not None:
            try:
                val_loss = float(reference.evaluate(inputs.to_torch(val[0]),
                                                    torch.from_numpy(np.ascontiguousarray(val[1]))))
            except _TORCH_FAILURES as ex:
                raise reference.blame(ex, val_source, val[0], val[1],
                                      f"validation loss failed at epoch {epoch}") from ex
        # per-epoch schedules step here (ReduceLROnPlateau on the validation loss, else the training loss)
        reference.end_epoch(val_loss if val_loss is not None else epoch_loss(values))
        record = reference.record(epoch, epoch_loss(values), val_loss, time.perf_counter() - started, record_values)
        if devices.is_cuda(device):
            record.device, record.deterministic = device, deterministic
        history.append(record)
    return history
