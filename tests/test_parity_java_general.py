"""Any exported module trained from Java (gradbridge's native layer, in this process) equals the eager reference.

MLP classifiers, 10 epochs driven through the Java TrainingModule: full-batch `trainStep` with
every optimizer configuration of tests/test_optim.py, and fused mini-batch `trainEpoch` (with
dropout) with Adam and with SGD + nesterov + weight decay. Expected: bitwise.
"""

from __future__ import annotations

import json

import jpype
import numpy as np
import pytest
import torch

from gradbridge import export_training_module, protocol
from gradbridge.models import SmallCNN, mlp
from gradbridge.reference import Reference
from tests.matrix import OPTIMIZER_VARIANTS as OPTIMIZER_CONFIGS

EPOCHS = 10
#: every optimizer configuration of the Python-side parity tests, here trained through Java
ALL_OPTIMIZERS = OPTIMIZER_CONFIGS

OPTIMIZERS = {
    "adam": {"name": "adam", "lr": 0.01},
    "sgd-nesterov-wd": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
}


def _classification(n=96, features=5, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x[:, 0] * 2 + x[:, 1]).mul(1.3).round().clamp(-1, 2).long() + 1
    return x, y


def _params_equal(java_module, reference):
    java = {str(k): np.asarray(v) for k, v in java_module.getParameters().items()}
    python = {k: v.double().numpy().ravel() for k, v in reference.parameters().items()}
    assert java.keys() == python.keys()
    return max(float(np.abs(java[k] - python[k]).max()) for k in java)


@pytest.fixture
def export(tmp_path):
    def _export(model, optimizer, x, y):
        return export_training_module(model, "cross_entropy", optimizer, tmp_path / "model.pt", example_inputs=(x, y))
    return _export


@pytest.mark.parametrize("optimizer", ALL_OPTIMIZERS, ids=str)
def test_full_batch_train_step_from_java_equals_reference(jvm, export, optimizer):
    # Given an MLP classifier exported with the optimizer, and its eager twin
    torch.manual_seed(0)
    model = mlp(in_features=5, hidden=(16, 16), out_features=4)
    x, y = _classification()
    path = export(model, ALL_OPTIMIZERS[optimizer], x, y)
    reference = Reference(path, model)
    module = jvm.load_module(path)
    try:
        jx, jy = jvm.to_tensor(x.numpy()), jvm.to_tensor(y.numpy())
        # When Java trains EPOCHS full-batch epochs and the reference does the same
        for epoch in range(EPOCHS):
            with jvm.java_errors():
                java_loss = float(module.trainStep(jx, jy))
            python_loss = float(reference.train_step(x, y))
            # Then loss and parameters agree exactly after every epoch
            assert java_loss == python_loss, f"epoch {epoch}: {java_loss!r} vs {python_loss!r}"
            assert _params_equal(module, reference) == 0.0, f"epoch {epoch}"
        assert float(module.getLr()) == ALL_OPTIMIZERS[optimizer]["lr"]
    finally:
        module.close()


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=str)
def test_fused_mini_batch_epochs_from_java_equal_reference(jvm, export, optimizer):
    torch.manual_seed(0)
    model = mlp(in_features=5, hidden=(16, 16), out_features=4, dropout=0.2)
    x, y = _classification()
    path = export(model, OPTIMIZERS[optimizer], x, y)
    reference = Reference(path, model)
    module = jvm.load_module(path)
    try:
        jx, jy = jvm.to_tensor(x.numpy()), jvm.to_tensor(y.numpy())
        for epoch in range(EPOCHS):
            perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
            # the same generator state on both sides: dropout masks are drawn identically
            torch.manual_seed(100 + epoch)
            with jvm.java_errors():
                java_losses = np.asarray(module.trainEpoch(jx, jy, jvm.to_tensor(perm.numpy()), 32))
            torch.manual_seed(100 + epoch)
            python_losses = np.array([float(v) for v in reference.train_epoch(x, y, perm, 32)])
            assert np.array_equal(java_losses, python_losses), f"epoch {epoch}"
            assert _params_equal(module, reference) == 0.0, f"epoch {epoch}"
    finally:
        module.close()


def test_batchnorm_buffers_and_eval_mode_from_java(jvm, tmp_path):
    torch.manual_seed(0)
    model = SmallCNN(side=8, channels=4, classes=3)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 3, (40,), generator=g)
    path = export_training_module(model, "cross_entropy", {"name": "adamw", "lr": 0.01}, tmp_path / "cnn.pt",
                                  example_inputs=(x, y))
    reference = Reference(path, model)
    module = jvm.load_module(path)
    try:
        jx, jy = jvm.to_tensor(x.numpy()), jvm.to_tensor(y.numpy())
        for _ in range(5):
            assert float(module.trainStep(jx, jy)) == float(reference.train_step(x, y))
        # eval mode uses the running statistics: the same validation loss on both sides
        assert float(module.evaluate(jx, jy)) == float(reference.evaluate(x, y))
        buffers = {str(k): np.asarray(v) for k, v in module.getBuffers().items()}
        for name, value in reference.buffers().items():
            assert np.array_equal(buffers[name], value.double().numpy().ravel()), name
        # back in training mode after evaluate: the next step still matches
        assert float(module.trainStep(jx, jy)) == float(reference.train_step(x, y))
        state = module.getOptimizerState()
        for key, values in reference.optimizer_state().items():
            for i, value in enumerate(values):
                assert np.array_equal(np.asarray(state.get(key).get(i)), value.double().numpy().ravel()), key
    finally:
        module.close()


def test_set_parameters_and_lr_from_java(jvm, tmp_path):
    torch.manual_seed(0)
    x, y = _classification()
    path = export_training_module(mlp(5, (8,), 4), "cross_entropy", {"name": "sgd", "lr": 0.1}, tmp_path / "m.pt",
                                  example_inputs=(x, y))
    module = jvm.load_module(path)
    try:
        params = module.getParameters()
        zeros = jpype.JClass("java.util.LinkedHashMap")()
        for name in params.keySet():
            zeros.put(name, jpype.JArray(jpype.JDouble)(len(params.get(name))))
        module.setParameters(zeros)
        assert all(not np.asarray(v).any() for v in module.getParameters().values())
        module.setLr(0.25)
        assert float(module.getLr()) == 0.25
        from gradbridge import InvalidInputError

        zeros.remove(next(iter(zeros.keySet())))
        with pytest.raises(InvalidInputError, match="set_parameters: expected values for"):
            with jvm.java_errors():
                module.setParameters(zeros)
    finally:
        module.close()


class _RowBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 4)
        self.register_buffer("first_row", torch.zeros(5))

    def forward(self, x):
        return self.lin(x) + self.first_row.sum()


@pytest.mark.every_torch_java
def test_a_snapshot_is_the_module_or_refused_when_tensors_share_a_storage(jvm, tmp_path):
    """A snapshot (ModuleAccess.snapshot: what gradbridge-spark saves each epoch's end from, off the step path):
    after BatchNorm steps its archive is the module's byte for byte, and it stays so while the module
    trains on; a module two of whose tensors share a storage gets none (a copy would split them)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, 1, 8, 8, generator=g), torch.randint(0, 3, (40,), generator=g)
    path = export_training_module(SmallCNN(side=8, channels=4, classes=3), "cross_entropy",
                                  {"name": "adamw", "lr": 0.01}, tmp_path / "cnn.pt", example_inputs=(x, y))
    checkpoint = jpype.JClass("dev.gradbridge.Metadata$Checkpoint").progress(1, 0)
    module = jvm.load_module(path)
    try:
        jx, jy = jvm.to_tensor(x.numpy()), jvm.to_tensor(y.numpy())
        for _ in range(2):
            module.trainStep(jx, jy)
        access = jvm.jclass("dev.gradbridge.internal.ModuleAccess")  # library-internal calls, no API
        now = bytes(access.checkpointArchive(module, checkpoint))
        copy = access.snapshot(module).get()
        try:
            assert bytes(access.checkpointArchive(copy, checkpoint)) == now
            module.trainStep(jx, jy)
            assert bytes(access.checkpointArchive(copy, checkpoint)) == now
            assert bytes(access.checkpointArchive(module, checkpoint)) != now
        finally:
            copy.close()
    finally:
        module.close()
    x = torch.randn(8, 5, generator=g)
    path = export_training_module(_RowBuffer(), "mse", {"name": "sgd", "lr": 0.1}, tmp_path / "view.pt",
                                  example_inputs=(x, torch.randn(8, 4, generator=g)))
    # the exporter copies every tensor apart; a module edited after export can alias two
    scripted = torch.jit.load(str(path))
    scripted.model.first_row = scripted.model.lin.weight.detach()[0]
    aliased = tmp_path / "aliased.pt"
    torch.jit.save(scripted, str(aliased), _extra_files={protocol.METADATA_FILE: json.dumps(protocol.read_metadata(path))})
    module = jvm.load_module(aliased)
    try:
        assert not access.snapshot(module).isPresent()
    finally:
        module.close()
