"""The Java OnlineLearner from Python (in-process JPype): open one, numpy <-> HostTensor.

    learner = online.open_learner("model.pt", "log", max_batch=32, publish_every=1)
    version, y = online.predict(learner, x)
    learner.learn(online.host_tensor(x), online.host_tensor(y))
    learner.close()
"""

from __future__ import annotations

import os
import time
from typing import Tuple

import numpy as np

from . import protocol
from .jvm import dtype_name, java_errors, java_shape, jclass


def host_tensor(values: np.ndarray):
    """A ``dev.gradbridge.online.HostTensor`` holding ``values`` (float32, float64 or int64; float16 widened to
    the float32 carrier exactly, which the learner casts back for a float16 input: ``protocol.CARRIER``)."""
    import jpype

    values = np.asarray(values)
    if values.dtype == np.float16:
        values = values.astype(np.float32)
    dtype = dtype_name(values)  # the same dtypes and words as every other way into Java (gradbridge.jvm)
    HostTensor = jclass("dev.gradbridge.online.HostTensor")
    raw = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes()
    return HostTensor.of(dtype, java_shape(values), jpype.JArray(jpype.JByte)(raw))


def to_numpy(tensor) -> np.ndarray:
    """A HostTensor's values as a numpy array of its dtype and shape; a bfloat16 one (numpy has no bfloat16)
    widened to float32 exactly."""
    dtype = str(tensor.getDtype())
    if dtype == "bfloat16":
        return np.array(tensor.toFloatArray(), dtype=np.float32).reshape([int(d) for d in tensor.getShape()])
    little_endian = np.dtype(dtype).newbyteorder("<")  # HostTensor's bytes are little-endian
    return np.frombuffer(bytes(tensor.toBytes()), dtype=little_endian).reshape([int(d) for d in tensor.getShape()])


def open_learner(model_path: str | os.PathLike, log_dir: str | os.PathLike, *,
                 max_batch: int = protocol.DEFAULT_MAX_BATCH, max_wait_ms: int = protocol.DEFAULT_MAX_WAIT_MILLIS,
                 publish_every: int = protocol.DEFAULT_PUBLISH_EVERY,
                 checkpoint_every: int = protocol.DEFAULT_CHECKPOINT_EVERY,
                 queue_capacity: int = protocol.DEFAULT_QUEUE_CAPACITY, predictors: int | None = None,
                 fsync: str = protocol.DEFAULT_FSYNC, max_grad_norm: float = protocol.DEFAULT_MAX_GRAD_NORM,
                 max_input_abs: float | None = None, gate_data: str | os.PathLike | None = None,
                 gate_max_regression: float = protocol.DEFAULT_GATE_MAX_REGRESSION,
                 gate_on_hold: str = protocol.DEFAULT_GATE_ON_HOLD, keep_versions: int | None = None,
                 seed: int | None = None, time_phases: bool = False):
    """Open (or resume) a Java OnlineLearner in this process; close it when done. ``predictors``,
    ``max_input_abs`` and ``keep_versions`` None keep the learner's defaults. ``gate_data`` (an .npz)
    turns the publish gate on (``OnlineLearnerBuilder.optGate``); ``seed`` the run's seed of dropout's draws
    (``optSeed``); ``time_phases`` where the training thread's time goes (``learner.phaseTimes()``)."""
    OnlineLearner = jclass("dev.gradbridge.online.OnlineLearner")
    FsyncPolicy = jclass("dev.gradbridge.online.FsyncPolicy")
    Paths = jclass("java.nio.file.Paths")
    with java_errors():
        builder = (OnlineLearner.builder().optMaxBatch(max_batch).optMaxWaitMillis(max_wait_ms)
                   .optPublishEvery(publish_every).optCheckpointEvery(checkpoint_every).optQueueCapacity(queue_capacity)
                   .optFsync(FsyncPolicy.parse(fsync)).optMaxGradNorm(float(max_grad_norm)))
        if predictors is not None:
            builder = builder.optPredictors(predictors)
        if seed is not None:
            builder = builder.optSeed(seed)
        if time_phases:
            builder = builder.optTimePhases(True)
        if max_input_abs is not None:
            builder = builder.optMaxInputAbs(float(max_input_abs))
        if gate_data is not None:
            HoldPolicy = jclass("dev.gradbridge.online.HoldPolicy")
            builder = (builder.optGate(Paths.get(str(gate_data)), float(gate_max_regression))
                       .optGateOnHold(HoldPolicy.parse(gate_on_hold)))
            if keep_versions is not None:
                builder = builder.optKeepVersions(keep_versions)
        return builder.open(Paths.get(str(model_path)), Paths.get(str(log_dir)))


def host_inputs(x):
    """An array as a HostTensor, or a dict of arrays by input name as a Java Map of HostTensors
    (a module of several inputs)."""
    if not isinstance(x, dict):
        return host_tensor(x)
    inputs = jclass("java.util.LinkedHashMap")()
    for name, values in x.items():
        inputs.put(name, host_tensor(values))
    return inputs


def predict(learner, x) -> Tuple[int, np.ndarray]:
    """(version id, output) of ``learner.predict(x)``; ``x`` an array, or a dict of arrays by input name."""
    with java_errors():
        prediction = learner.predict(host_inputs(x))
    return int(prediction.getVersion()), to_numpy(prediction.getOutput())


def learn(learner, x, y: np.ndarray) -> int:
    """``learner.learn(x, y)`` (``x`` an array, or a dict of arrays by input name); returns the first
    event's sequence number."""
    with java_errors():
        return int(learner.learn(host_inputs(x), host_tensor(y)))


def progressive(learner, rounds: int, next_round, metrics) -> Tuple[float, list]:
    """Progressive validation (the online demos): each round's inputs are predicted by the serving version
    first, then learned from, and the next round waits for that update. ``next_round()`` gives ``(x, y)``;
    ``metrics(outputs, targets)`` a window's (metric, log-loss) over its rounds' outputs and targets
    concatenated. Closes the learner; returns the seconds taken and, per window of a tenth of the rounds,
    (first version, last version, events, metric, log-loss)."""
    seconds = jclass("java.util.concurrent.TimeUnit").SECONDS
    shown = []  # (version, outputs, targets) per round
    started = time.perf_counter()
    try:
        for _ in range(rounds):
            x, y = next_round()
            version, outputs = predict(learner, x)
            shown.append((version, outputs.copy(), y))
            learn(learner, x, y)
            learner.awaitIdle(60, seconds)
    finally:
        learner.close()
    elapsed = time.perf_counter() - started
    window = max(1, rounds // 10)
    rows = []
    for start in range(0, rounds, window):
        part = shown[start:start + window]
        outputs, targets = np.concatenate([p[1] for p in part]), np.concatenate([p[2] for p in part])
        rows.append((part[0][0], part[-1][0], len(targets), *metrics(outputs, targets)))
    return elapsed, rows
