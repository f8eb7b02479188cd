"""The Java OnlineLearner from the tests, in this process through JPype: numpy arrays as its HostTensor and a
learner opened with the options the tests vary (tests/test_online_learner.py, test_online_real_models.py,
test_protocol3.py)."""

from __future__ import annotations

import numpy as np


def host_tensor(values: np.ndarray):
    """``values`` (float32, float64 or int64) as a dev.gradbridge.online.HostTensor: little-endian bytes and a shape."""
    import jpype

    HostTensor = jpype.JClass("dev.gradbridge.online.HostTensor")
    dtype = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64", np.dtype(np.int64): "int64"}[values.dtype]
    raw = np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<")).tobytes()
    return HostTensor.of(dtype, jpype.JArray(jpype.JLong)([int(d) for d in values.shape]), jpype.JArray(jpype.JByte)(raw))


def open_learner(model, log_dir, *, batch=8, wait_ms=2, publish=2, checkpoint=5, capacity=10_000, fsync="never"):
    """An OnlineLearner on ``model`` logging to ``log_dir`` (two predictors)."""
    import jpype

    OnlineLearner = jpype.JClass("dev.gradbridge.online.OnlineLearner")
    FsyncPolicy = jpype.JClass("dev.gradbridge.online.FsyncPolicy")
    Paths = jpype.JClass("java.nio.file.Paths")
    return (OnlineLearner.builder().optMaxBatch(batch).optMaxWaitMillis(wait_ms).optPublishEvery(publish)
            .optCheckpointEvery(checkpoint).optQueueCapacity(capacity).optPredictors(2)
            .optFsync(FsyncPolicy.parse(fsync)).open(Paths.get(str(model)), Paths.get(str(log_dir))))
