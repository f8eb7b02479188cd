"""Java training in this process (JPype): the Java ``Trainer`` on numpy data, and the seed
example's data generator. (Java in a JVM of its own: ``gradbridge._runtime.launcher``.)

Numpy arrays reach Java as direct ByteBuffers over their own memory (no copy in Python, no
per-element conversion); libtorch tensors are built on that memory, so the arrays must stay
alive and unchanged during the call, which these functions guarantee by holding them.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ._runtime import devices, inputs
from . import messages, protocol
from ._runtime.data import check as check_data
from .errors import DivergenceError, InvalidInputError
from .history import History
from .jvm import direct_buffer, dtype_name, java_errors, jclass, load_module


def _as_java_long(value: int) -> int:
    """The signed 64-bit value with the same bits (seeds are unsigned 64-bit in the shuffle spec)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def dataset(x: Any, y: np.ndarray, source: str):
    """A Java ``Dataset`` over the memory of ``x`` (an array, or a dict of arrays by input name) and
    ``y`` (keep them alive while it is used; close it)."""
    Dataset = jclass("dev.gradbridge.data.Dataset")
    ArrayList = jclass("java.util.ArrayList")
    named = {**inputs.arrays(x), inputs.Y: y}
    lists = [ArrayList() for _ in range(4)]
    for name, array in named.items():
        lists[0].add(name)
        lists[1].add(direct_buffer(array, f"{source} {name}"))
        lists[2].add(jclass("long[]")([int(d) for d in array.shape]))
        lists[3].add(dtype_name(array))
    with java_errors():
        return Dataset.fromBuffers(source, *lists)


def _contiguous(x: Any) -> Any:
    return {name: np.ascontiguousarray(a) for name, a in x.items()} if isinstance(x, dict) else np.ascontiguousarray(x)


def _carried(x: Any) -> Any:
    """A float16 array (checked: a float16 input's) widened to float32 exactly, the carrier Java casts back
    (``protocol.CARRIER``): Java takes float32, float64 and int64 arrays from Python."""
    if isinstance(x, dict):
        return {name: _carried(a) for name, a in x.items()}
    return x.astype(np.float32) if x.dtype == np.float16 else x


def train(model_path: str | os.PathLike, x: Any, y: np.ndarray, *, epochs: int,
          batch_size: Optional[int] = None, seed: Optional[int] = None, mode: Optional[str] = None,
          val: Optional[Tuple[np.ndarray, np.ndarray]] = None, checkpoint: str | os.PathLike | None = None,
          record_values: bool = True, allow_different_data: bool = False,
          op_libraries: Sequence[str | os.PathLike] = (), lr: Optional[float] = None,
          history: str | os.PathLike | None = None, source: str = "training data",
          val_source: str = "validation data", device: Optional[str] = None,
          deterministic: bool = True) -> History:
    """Run ``dev.gradbridge.Trainer`` in this process; returns its History.

    Same arguments and semantics as ``gradbridge.reference.train`` (``x``: an array, or for a model of
    several inputs a dict of arrays by input name); ``checkpoint`` is written
    after every epoch (a module loaded from a checkpoint resumes after its epochs).
    ``batch_size``, ``seed`` and ``mode`` default to 32, 0 and ``step``, or to the checkpoint's
    values when ``model_path`` is a checkpoint (a different value is refused, and so is other
    data unless ``allow_different_data``). ``op_libraries``: custom-operator libraries to load first.
    ``lr``: every parameter group's learning rate, set before the first epoch. ``history``: the
    history file the Trainer writes as it goes (``History.load`` reads it; a record of more than
    ``history.INLINE_VALUES_LIMIT`` values keeps them in its side file and reads them back from there).
    ``source`` and ``val_source`` name the data in error lines (e.g. the file the arrays came from).
    ``device``: ``cpu`` (None: the same), ``cuda`` or ``cuda:N``: the module is loaded there
    (``TrainingModule.load(path, device)``) and each batch copied there per step, with torch's
    deterministic algorithms on for the run unless ``deterministic`` is false (``Trainer.optDeterministic``).
    """
    epochs, batch_size, seed = _check_arguments(mode, lr, epochs, batch_size, seed)
    device = devices.require(devices.CPU if device is None else device)  # this process's torch: Java shares it
    arrays = [_contiguous(a) for a in (x, y, *(val or ()))]
    metadata = protocol.read_metadata(model_path)
    check_data(metadata, arrays[0], arrays[1], source)  # Java's checks and words, before any copy
    if val is not None:
        check_data(metadata, arrays[2], arrays[3], val_source)
    arrays = [_carried(a) for a in arrays]  # kept alive here while Java reads them
    module = load_module(model_path, op_libraries, device)
    datasets = []  # closed before the arrays go: their tensors use the arrays' memory
    try:
        with java_errors(), devices.deterministic(device, deterministic):
            if lr is not None:
                module.setLr(float(lr))
            train_data = dataset(arrays[0], arrays[1], source)
            datasets.append(train_data)
            if val is not None:
                datasets.append(dataset(arrays[2], arrays[3], val_source))
            trainer = _trainer(epochs=epochs, record_values=record_values, allow_different_data=allow_different_data,
                               batch_size=batch_size, seed=seed, mode=mode,
                               validation=datasets[1] if val is not None else None, device=device,
                               deterministic=deterministic, checkpoint=checkpoint, history=history)
            return History.from_java(trainer.fit(module, train_data))
    except DivergenceError as error:
        # The epochs completed before the divergent one travel on the error.
        error.history = History.from_java(error.__cause__.getHistory())
        raise
    finally:
        for data in datasets:
            data.close()
        module.close()
        del arrays  # only now may the memory go


def _check_arguments(mode: Optional[str], lr: Optional[float], epochs: int, batch_size: Optional[int],
                     seed: Optional[int]) -> Tuple[int, Optional[int], Optional[int]]:
    """``train``'s arguments checked first, in Python: JPype would raise TypeError/OverflowError, or
    truncate 2.7. Returns epochs, batch_size and seed as Java takes them."""
    if mode is not None and mode not in protocol.MODES:
        raise InvalidInputError(messages.unknown_mode(mode))
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 <= lr < float("inf")):
        raise InvalidInputError(messages.argument("lr", "a finite number >= 0", lr))
    epochs = messages.check_integer("epochs", epochs, 1, messages.INT_MAX)
    if batch_size is not None:
        batch_size = messages.check_integer("batch_size", batch_size, 1, messages.INT_MAX)
    if seed is not None:
        seed = messages.check_integer("seed", seed, -(1 << 63), (1 << 64) - 1)
    return epochs, batch_size, seed


def _trainer(*, epochs: int, record_values: bool, allow_different_data: bool, batch_size: Optional[int],
             seed: Optional[int], mode: Optional[str], validation: Any, device: str, deterministic: bool,
             checkpoint: str | os.PathLike | None, history: str | os.PathLike | None):
    """The Java ``Trainer`` of ``train``'s options (``validation``: the validation Dataset, or None); an
    option left None keeps the Trainer's default (a checkpoint's value)."""
    Trainer = jclass("dev.gradbridge.Trainer")
    Paths = jclass("java.nio.file.Paths")
    builder = (Trainer.builder().optEpochs(int(epochs)).optRecordValues(bool(record_values))
               .optAllowDifferentData(bool(allow_different_data)))
    if batch_size is not None:
        builder.optBatchSize(int(batch_size))
    if seed is not None:
        builder.optSeed(_as_java_long(seed))
    if mode is not None:
        builder.optMode(Trainer.Mode.parse(mode))
    if validation is not None:
        builder.optValidation(validation)
    if devices.is_cuda(device):
        builder.optDevice(device).optDeterministic(bool(deterministic))
    if checkpoint is not None:
        builder.optCheckpoint(Paths.get(str(checkpoint)))
    if history is not None:
        builder.optHistory(Paths.get(str(history)))
    return builder.build()


def seed_data(seed: int = 42, n: int = 100) -> Tuple[np.ndarray, np.ndarray]:
    """The seed driver's data set, generated by Java's ``java.util.Random``: x, y of shape [n, 1]."""
    seed = messages.check_integer("seed", seed, -(1 << 63), (1 << 63) - 1)
    n = messages.check_integer("n", n, 1, messages.INT_MAX)
    example = jclass("dev.gradbridge.examples.LinearRegressionTraining")
    with java_errors():
        data = example.generateData(seed, n)
        x = np.array(data.getX(), dtype=np.float32).reshape(n, 1)
        y = np.array(data.getY(), dtype=np.float32).reshape(n, 1)
    return x, y
