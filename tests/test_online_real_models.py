"""The online learner on models with buffers and dropout, in this process: every version carries the
buffers training writes (BatchNorm's statistics), constant buffers stay as the module file has them,
each micro-batch's dropout draws from the generator seeded for it, predictors stay in eval mode; a halt
mid-stream and a restart, then `gradbridge replay` against the user's own eager model, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradbridge import export_training_module, protocol
from gradbridge import replay as replay_mod

from .data import labelled
from .online_support import host_tensor, open_learner


class DropoutBatchNormNet(nn.Module):
    """BatchNorm (trained buffers), dropout (random draws) and a constant buffer (never written). The
    BatchNorm normalizes 4 channels of 4 values each, so a micro-batch of one event trains too."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 16)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Sequential(nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
        self.register_buffer("scale", torch.tensor([1.0, 0.5, 2.0, 1.0]), persistent=False)

    def forward(self, x):
        h = self.norm(self.inner(x * self.scale).reshape(-1, 4, 4))
        return self.head(h.reshape(-1, 16))


def _feed(learner, x, y, rows=4):
    import jpype

    for start in range(0, len(x), rows):
        learner.learn(host_tensor(x[start:start + rows]), host_tensor(y[start:start + rows]))
        learner.predict(host_tensor(x[start:start + 1]))
    assert learner.awaitIdle(60, jpype.JClass("java.util.concurrent.TimeUnit").SECONDS)


@pytest.mark.every_torch_java
@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_batchnorm_and_dropout_learn_online_and_replay_bitwise(jvm, tmp_path, fmt):
    torch.manual_seed(0)
    model = DropoutBatchNormNet()
    x, y = labelled(160, 4, labels="mixed")
    path = tmp_path / "net.pt"
    export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters(), lr=1e-2), path,
                           example_inputs=(torch.from_numpy(x[:8]), torch.from_numpy(y[:8])), format=fmt)
    metadata = protocol.read_metadata(path)
    assert metadata[protocol.CAPTURE_KEY][protocol.DRAWS_RANDOM_KEY] is True
    assert {b["name"]: b["trained"] for b in metadata["buffers"]} == {
        "scale": False, "norm.running_mean": True, "norm.running_var": True, "norm.num_batches_tracked": True}

    learner = open_learner(path, tmp_path / "log", batch=8, publish=2, checkpoint=3)
    try:
        _feed(learner, x[:80], y[:80])
    finally:
        learner.halt()  # as a crash would: the log holds the rest
    learner = open_learner(path, tmp_path / "log", batch=8, publish=2, checkpoint=3)
    try:
        _feed(learner, x[80:], y[80:])
        version = learner.currentVersion()
        served = np.frombuffer(bytes(learner.predict(host_tensor(x[:5])).getOutput().toBytes()),
                               dtype="<f4").reshape(5, 3)
    finally:
        learner.close()

    report = replay_mod.replay(tmp_path / "log", path, model=DropoutBatchNormNet(), keep_parameters=True)
    print(report.table())
    assert report.bitwise, report.verdict()
    assert report.events == 160 and report.unapplied_events == 0
    # the versions' digests cover the trained buffers (BatchNorm's statistics moved), not the constant one
    digests = {str(k) for k in version.getDigests().keySet()}
    assert {"norm.running_mean", "norm.num_batches_tracked"} <= digests and "scale" not in digests

    # A prediction is the user's eager model in eval mode on that version's parameters and trained buffers.
    eager = DropoutBatchNormNet()
    state = report.parameters[int(version.getId())]
    with torch.no_grad():
        for name, t in list(eager.named_parameters()) + list(eager.named_buffers()):
            if name in state:
                t.copy_(state[name])
        expected = eager.eval()(torch.from_numpy(x[:5])).numpy()
    assert served.tobytes() == expected.astype("<f4").tobytes()
