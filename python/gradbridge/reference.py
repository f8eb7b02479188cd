"""The eager-PyTorch reference: the same training as the Java run, done with torch.optim.

``train`` is the single-process ``Trainer``'s twin, ``train_sharded`` gradbridge-spark's (the replay of a
data-parallel run). Both train ``Reference`` (``gradbridge.eager``, also importable from here): the eager twin
of an exported training module, started from the module's own initial tensors, trained with the real
``torch.optim`` optimizer and ``torch.nn.functional`` loss named in the metadata, on your eager ``nn.Module``
when you pass one, else on the model stored in the .pt.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Callable, Dict, Optional, Union

import numpy as np
import torch
from torch import Tensor, nn

from ._runtime import devices, inputs, shuffle
from . import messages, protocol, spark_history
from ._runtime import shuffle as shuffle_module
from ._runtime import data as data_checks
from .eager import _TORCH_FAILURES, Reference, _as_numpy, combine_shards, initial_state  # noqa: F401 (public here)
from .errors import DivergenceError, InvalidInputError, ProtocolError
from .history import History, epoch_loss


def shards_sha256(x, y, shards: int, metadata: Optional[Dict[str, Any]] = None) -> str:
    """A gradbridge-spark checkpoint's ``shards_sha256``: SHA-256 over each partition's SHA-256 of its
    x bytes (``x`` a dict: each input's, in the dict's order, which is to be the module's) then its y
    bytes (partition p holds rows p, p + K, ... in order), in partition order; a 16-bit input's bytes as
    the shards hold it, its dtype's words (``metadata``: the module's, needed for such an input).
    (``data_sha256`` of a single-process run is SHA-256 of all x bytes then all y bytes.)"""
    import hashlib

    arrays = [*inputs.arrays(x).values(), y]
    if metadata is not None:
        xs, ys = data_checks.tensors(metadata, x, y, "training data")
        arrays = [t.view(torch.int16) if t.dtype == torch.bfloat16 else t for t in [*inputs.arrays(xs).values(), ys]]
    outer = hashlib.sha256()
    for p in range(shards):
        inner = hashlib.sha256()
        for array in arrays:
            inner.update(np.ascontiguousarray(np.asarray(array)[p::shards]).tobytes())
        outer.update(inner.digest())
    return outer.hexdigest()


def check_data_parallel(model_path: str | os.PathLike, metadata: Dict[str, Any]) -> None:
    """What gradbridge-spark refuses (same lines): a protocol-1 module, trained buffers without
    ``set_state`` (exported before it), accumulation."""
    missing = [m for m in protocol.DATA_PARALLEL_METHODS if m not in metadata["methods"]]
    if missing:
        raise ProtocolError(messages.data_parallel_methods(str(model_path), metadata["protocol_version"], missing))
    trained = [b["name"] for b in metadata["buffers"] if b.get("trained", True)]
    if trained and protocol.SET_STATE not in metadata["methods"]:
        raise ProtocolError(messages.data_parallel_buffers(str(model_path), trained))
    accumulate = int(metadata.get(protocol.FINE_TUNING_KEY, {}).get("accumulate", 1))
    if accumulate != 1:
        raise ValueError(messages.data_parallel_accumulate(str(model_path), accumulate))


#: libtorch's intra-op threads of a gradbridge-spark task on Spark's defaults (``spark.task.cpus``, 1,
#: and ``spark.gradbridge.threads`` unset): what the replay runs on unless told otherwise.
TASK_THREADS = 1


def train_sharded(model_path: str | os.PathLike, x: Any, y: np.ndarray, *, epochs: Optional[int] = None,
                  shards: Optional[int] = None, batch_size: Optional[int] = None, seed: Optional[int] = None,
                  shuffle: Optional[bool] = None, model: Optional[nn.Module] = None, start_epoch: int = 0,
                  record_values: bool = True, threads: Optional[int] = None,
                  run: Union[str, os.PathLike, History, spark_history.SparkRun, None] = None,
                  source: str = "training data", say: Optional[Callable[[str], None]] = None) -> History:
    """The Python replay of a gradbridge-spark run on ``shards`` partitions (``Reference.sharded_step``).

    ``x``: the inputs, an array, or for a model of several inputs a dict of arrays by input name.
    Each epoch takes ``shuffle.permutation(seed, epoch, n)`` (or ``0..n-1`` without shuffling) in
    global mini-batches of ``batch_size``; the epoch loss is the mean of the step losses, as in ``train``.
    Partition k's forward and backward of the run's step s (``epoch * steps_per_epoch`` plus the step's
    index in the epoch) seed torch with ``shuffle.step_seed(seed, s, k)`` (dropout's draws); the buffers
    a step leaves are its first partition's with rows (``sharded_step``). libtorch runs on ``threads``
    intra-op threads, the tasks' count, as a few kernels' bits depend on it; the caller's count is restored after.

    ``run``: the history the run wrote (its path, or that History; ``spark_history.read``): ``shards``,
    ``batch_size``, ``seed``, ``shuffle`` and ``threads`` default to what it records, ``epochs`` to the run's
    last epoch + 1 (a resumed run's history too replays from the module the run started from), and the data
    must be the run's (its ``shards_sha256``), else one line naming ``source`` and the history. Without
    ``run``: ``epochs`` and ``shards`` are needed, the batch size and seed are the protocol's defaults, and
    ``threads`` is ``TASK_THREADS`` (a task's count on Spark's defaults). Arguments given win.
    ``say``: takes the line that names the thread count (``replaying on 1 intra-op thread, ...``); by default
    it goes to stderr, and only when the count differs from this process's.
    """
    recorded = None if run is None else spark_history.read(run)
    given_threads = threads
    epochs, shards, batch_size, seed, shuffle, threads, start_epoch = _sharded_settings(
        recorded, epochs=epochs, shards=shards, batch_size=batch_size, seed=seed, shuffle=shuffle, threads=threads,
        start_epoch=start_epoch)
    metadata = protocol.read_metadata(model_path)
    check_data_parallel(model_path, metadata)
    xs, ys = data_checks.tensors(metadata, x, y, source)  # a 16-bit input's carrier cast
    _check_sharded_data(metadata, x, y, len(ys), batch_size, shards, recorded, source)
    why = (messages.THREADS_GIVEN.format(threads) if given_threads is not None
           else messages.THREADS_RECORDED.format(recorded.source) if recorded is not None else messages.THREADS_DEFAULT)
    reference = Reference(model_path, model)
    previous = torch.get_num_threads()
    if say is not None:
        say(messages.replay_threads(threads, previous, why))
    elif previous != threads:
        print(messages.replay_threads(threads, previous, why), file=sys.stderr)
    torch.set_num_threads(threads)
    try:
        history = _sharded_epochs(reference, xs, ys, x, y, range(start_epoch, start_epoch + epochs),
                                  shards=shards, batch_size=batch_size, seed=seed, shuffle=shuffle, threads=threads,
                                  record_values=record_values, source=source)
    finally:
        torch.set_num_threads(previous)
    history.buffers = _as_numpy(reference.buffers())
    return history


def _sharded_settings(recorded: Optional[spark_history.SparkRun], *, epochs: Optional[int], shards: Optional[int],
                      batch_size: Optional[int], seed: Optional[int], shuffle: Optional[bool],
                      threads: Optional[int], start_epoch: int) -> tuple:
    """``train_sharded``'s run settings, checked: the arguments given, else what the run's history records,
    else the defaults. Returns epochs, shards, batch_size, seed, shuffle, threads, start_epoch."""
    if recorded is not None:
        settings = recorded.settings
        shards = settings.partitions if shards is None else shards
        batch_size = settings.batch_size if batch_size is None else batch_size
        seed = settings.seed if seed is None else seed
        shuffle = settings.shuffle if shuffle is None else shuffle
        threads = recorded.threads if threads is None else threads
        epochs = recorded.epochs[-1] + 1 - start_epoch if epochs is None else epochs
    if epochs is None or shards is None:
        raise TypeError("train_sharded() needs epochs= and shards=, or run= (the history of the run to replay)")
    batch_size = protocol.DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    seed = protocol.DEFAULT_SEED if seed is None else seed
    shuffle = True if shuffle is None else shuffle
    epochs = messages.check_integer("epochs", epochs, 1, messages.INT_MAX)
    shards = messages.check_integer("shards", shards, 1, messages.INT_MAX)
    start_epoch = messages.check_integer("start_epoch", start_epoch, 0, messages.INT_MAX - epochs)
    seed = messages.check_integer("seed", seed, -(1 << 63), (1 << 64) - 1)
    threads = messages.check_integer("threads", TASK_THREADS if threads is None else threads, 1, messages.MAX_THREADS)
    return epochs, shards, batch_size, seed, shuffle, threads, start_epoch


def _check_sharded_data(metadata: Dict[str, Any], x: Any, y: np.ndarray, n: int, batch_size: int, shards: int,
                        recorded: Optional[spark_history.SparkRun], source: str) -> None:
    """What gradbridge-spark refuses of the data (no rows, a batch size past them, fewer rows than
    partitions), and, replaying a recorded run on its partition count, data other than the run's."""
    if n == 0:
        raise InvalidInputError(messages.empty_dataset(source))
    if not 1 <= batch_size <= n:
        raise InvalidInputError(messages.batch_size(n, batch_size))
    if shards > n:
        raise InvalidInputError(f"{n} rows cannot fill {shards} partitions")
    if recorded is not None and shards == recorded.settings.partitions:
        arrays = inputs.arrays(x)  # hashed in the module's order of inputs, as the run's tasks hash them
        digest = shards_sha256({name: arrays[name] for name in inputs.names(metadata) if name in arrays}, y, shards)
        if digest != recorded.settings.shards_sha256:
            raise InvalidInputError(messages.spark_history_data(source, recorded.source, shards, digest,
                                                                recorded.settings.shards_sha256))


def _sharded_epochs(reference: Reference, xs: Any, ys: Tensor, x: Any, y: np.ndarray, epochs: range, *, shards: int,
                    batch_size: int, seed: int, shuffle: bool, threads: int, record_values: bool,
                    source: str) -> History:
    """``train_sharded``'s epochs on the checked data (``xs``, ``ys``; ``x``, ``y`` as given, for the
    line that blames them), under the replay's thread count."""
    history = History()
    n = len(ys)
    steps = (n + batch_size - 1) // batch_size
    started = time.perf_counter()
    for epoch in epochs:
        order = shuffle_module.permutation(seed, epoch, n) if shuffle else list(range(n))
        first = epoch * steps  # the run's step number of the epoch's first step
        try:
            values = [reference.sharded_step(xs, ys, order[i:i + batch_size], shards,
                                             [shuffle_module.step_seed(seed, first + i // batch_size, k)
                                              for k in range(shards)])
                      for i in range(0, n, batch_size)]
        except _TORCH_FAILURES as ex:  # gradbridge-spark refuses such data before its first step
            raise reference.blame(ex, source, x, y, f"training step failed at epoch {epoch}") from ex
        _raise_if_diverged(values, epoch, n, batch_size, history)
        reference.end_epoch(epoch_loss(values))
        record = reference.record(epoch, epoch_loss(values), None, time.perf_counter() - started, record_values)
        record.threads = threads
        history.append(record)
    return history


def _raise_if_diverged(values: list, epoch: int, n: int, batch: int, history: History) -> None:
    """DivergenceError at an epoch's first NaN or infinite batch loss, holding the epochs before it."""
    for index, value in enumerate(values):
        if math.isnan(value) or math.isinf(value):
            first = index * batch
            error = DivergenceError(f"{messages.divergence(value, epoch, index, first, min(n, first + batch) - 1)}; "
                                    f"{len(history)} completed epoch(s) kept in error.history")
            error.history = history  # every epoch before the divergent one
            raise error


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
    xs, ys = data_checks.tensors(reference.metadata, xs, ys, source)  # a 16-bit input's carrier cast
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
        _raise_if_diverged(values, epoch, n, batch, history)
        val_loss = None
        if val is not None:
            try:
                val_loss = float(reference.evaluate(*data_checks.tensors(reference.metadata, val[0], val[1], val_source)))
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
