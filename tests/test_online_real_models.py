"""The online learner on models with buffers and dropout, in this process: every version carries the
buffers training writes (BatchNorm's statistics), constant buffers stay as the module file has them,
each micro-batch's dropout draws from the generator seeded for it, predictors stay in eval mode; a halt
mid-stream and a restart, then `gradbridge replay` against the user's own eager model, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from gradbridge import export_training_module, protocol
from gradbridge.errors import FineTuneError
from gradbridge.export import state_dict_of
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


class FrozenBaseNet(nn.Module):
    """A frozen base (a LoRA model's, in small), a constant buffer and a head that trains."""

    def __init__(self):
        super().__init__()
        self.base = nn.Linear(4, 64)
        self.head = nn.Linear(64, 3)
        self.register_buffer("scale", torch.tensor([1.0, 0.5, 2.0, 1.0]), persistent=False)
        self.base.requires_grad_(False)

    def forward(self, x):
        return self.head(torch.relu(self.base(x * self.scale)))


def _checkpoint_state(checkpoint, fmt):
    """The checkpoint module's parameters and buffers by name, as stored (a frozen one left out has zero elements)."""
    if fmt == "torchscript":
        module = torch.jit.load(str(checkpoint))
        named = [(name, getattr(module.params, str(i))) for i, name in enumerate(module.names)]
        named += list(zip(module.buffer_name_list, module.buffer_list))
        return {name: tuple(t.shape) for name, t in named}
    import zipfile

    with zipfile.ZipFile(checkpoint) as archive:
        program = json.loads(archive.read(protocol.METADATA_FILE))[protocol.PROGRAM_KEY]
    return {e["name"].split(":", 1)[1]: tuple(e["shape"]) for e in program["state"]
            if e["name"].startswith(("param:", "buffer:"))}


@pytest.mark.every_torch_java
@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_frozen_weights_are_one_copy_and_checkpoints_leave_them_out(jvm, tmp_path, fmt):
    """A module holds another's frozen tensors in place of its own (ModuleAccess.share: no copy; the predictors'
    pool is PredictorPoolTest's); a checkpoint holds what training changed only, and a restart from it takes the
    rest from the module file: predictions and the replay bit for bit."""
    import jpype

    torch.manual_seed(0)
    model = FrozenBaseNet()
    x, y = labelled(96, 4, labels="mixed")
    path = tmp_path / "net.pt"
    export_training_module(model, "cross_entropy", torch.optim.Adam(model.head.parameters(), lr=1e-2), path,
                           example_inputs=(torch.from_numpy(x[:8]), torch.from_numpy(y[:8])), format=fmt)
    ModuleAccess = jpype.JClass("dev.gradbridge.internal.ModuleAccess")
    TrainingModule = jpype.JClass("dev.gradbridge.TrainingModule")
    file = jpype.JClass("java.nio.file.Paths").get(str(path))
    with TrainingModule.load(file) as first, TrainingModule.load(file) as second:
        frozen = ModuleAccess.frozen(first)
        assert [str(n) for n in frozen.names()] == ["base.weight", "base.bias", "scale"]
        assert ModuleAccess.share(second, frozen) > 0  # its own copies, replaced
        assert ModuleAccess.share(second, frozen) == 0  # by the very tensors the first holds
        frozen.close()

    learner = open_learner(path, tmp_path / "log", batch=8, publish=2, checkpoint=2)
    try:
        _feed(learner, x[:48], y[:48])
    finally:
        learner.halt()  # as a crash would: the restart starts from the last checkpoint
    (checkpoint,) = (tmp_path / "log").glob("checkpoint-v*.pt")
    assert checkpoint.name.endswith(".trained.pt"), checkpoint.name
    assert _checkpoint_state(checkpoint, fmt) == {"base.weight": (0,), "base.bias": (0,), "scale": (0,),
                                                  "head.weight": (3, 64), "head.bias": (3,)}
    if fmt == "torchscript":  # `gradbridge state-dict` takes what the checkpoint leaves out from --base
        with pytest.raises(FineTuneError, match="leaves out 2 frozen tensors"):
            state_dict_of(checkpoint)
        assert torch.equal(state_dict_of(checkpoint, base=path)["base.weight"], model.base.weight)
    learner = open_learner(path, tmp_path / "log", batch=8, publish=2, checkpoint=2)
    try:
        _feed(learner, x[48:], y[48:])
        version = learner.currentVersion()
        served = np.frombuffer(bytes(learner.predict(host_tensor(x[:5])).getOutput().toBytes()),
                               dtype="<f4").reshape(5, 3)
    finally:
        learner.close()

    report = replay_mod.replay(tmp_path / "log", path, model=FrozenBaseNet(), keep_parameters=True)
    assert report.bitwise, report.verdict()
    eager = FrozenBaseNet()
    state = report.parameters[int(version.getId())]
    with torch.no_grad():
        for name, t in eager.named_parameters():
            if name in state:
                t.copy_(state[name])
        expected = eager.eval()(torch.from_numpy(x[:5])).numpy()
    assert served.tobytes() == expected.astype("<f4").tobytes()
