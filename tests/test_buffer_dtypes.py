"""Buffers of every dtype the model has go through as they are: exported, trained from Java bit for bit
like the user's eager model, checkpointed and resumed; a non-persistent one (GPT-2's causal mask) stays
out of the state_dict gradbridge writes, as torch's ``model.state_dict()`` leaves it out.

Before, a bool, int8 or float16 buffer was refused at export ("unsupported dtype 'bool' for ...").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradbridge import History, compare_histories, export_training_module, java, messages, protocol, reference
from gradbridge._runtime import torchscript
from gradbridge.errors import DTypeError
from gradbridge.export import state_dict_of

from .data import labelled

pytestmark = pytest.mark.every_torch_java

FEATURES, CLASSES = 6, 3
ADAM = {"name": "adam", "lr": 0.01}


class BufferDtypes(nn.Module):
    """A classifier whose forward reads a buffer of each dtype; ``steps`` (int32) counts training calls."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(FEATURES, FEATURES)
        self.out = nn.Linear(FEATURES, CLASSES)
        self.register_buffer("mask", torch.tril(torch.ones(FEATURES, FEATURES, dtype=torch.bool)), persistent=False)
        self.register_buffer("codes", torch.tensor([1, -2, 3, 0, 5, -1], dtype=torch.int8))
        self.register_buffer("levels", torch.tensor([0, 7, 255, 3, 128, 1], dtype=torch.uint8))
        self.register_buffer("scale", torch.linspace(0.5, 1.5, FEATURES).to(torch.float16))
        self.register_buffer("shift", torch.linspace(-0.3, 0.3, FEATURES).to(torch.bfloat16))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int32))

    def forward(self, x):
        if self.training:
            self.steps.add_(1)
        h = self.hidden(x) * self.scale + self.shift + self.codes * 0.1 + self.levels / 255.0
        causal = self.hidden.weight.masked_fill(~self.mask, 0.0)  # as GPT-2's attention applies its mask
        h = torch.where(self.mask[1], h, h @ causal.t())
        return self.out(torch.tanh(h))


CONSTANT = ("mask", "codes", "levels", "scale", "shift")


@pytest.fixture
def model():
    torch.manual_seed(0)
    return BufferDtypes()


@pytest.fixture
def exported(model, tmp_path):
    return export_training_module(model, "cross_entropy", ADAM, tmp_path / "buffers.pt",
                                  example_inputs=labelled(8, FEATURES, tensors=True, labels="sum"))


def test_metadata_records_each_buffers_dtype_and_persistence(exported):
    buffers = protocol.read_metadata(exported)["buffers"]
    assert [(b["name"], b["dtype"], b["persistent"]) for b in buffers] == [
        ("mask", "bool", False), ("codes", "int8", True), ("levels", "uint8", True), ("scale", "float16", True),
        ("shift", "bfloat16", True), ("steps", "int32", True)]


def test_java_trains_like_the_eager_model_and_keeps_each_buffers_dtype(jvm, model, exported):
    x, y = labelled(48, FEATURES, tensors=True, labels="sum")
    eager = reference.Reference(exported, model)
    module = jvm.load_module(exported)
    try:
        jx, jy = jvm.to_tensor(x.numpy()), jvm.to_tensor(y.numpy())
        for step in range(5):
            with jvm.java_errors():
                java_loss = float(module.trainStep(jx, jy))
            assert java_loss == float(eager.train_step(x, y)), f"step {step}"
        java_parameters = {str(k): np.asarray(v) for k, v in module.getParameters().items()}
        assert all(np.array_equal(java_parameters[k], v.double().numpy().ravel())
                   for k, v in eager.parameters().items())
        # get_buffers: each buffer in its own dtype, the constant ones as the model has them
        tensors = module.call("get_buffers")
        try:
            dtypes = [str(t.dtype().torchName()) for t in tensors]
        finally:
            for t in tensors:
                t.close()
        assert dtypes == [str(b.dtype).replace("torch.", "") for b in eager.buffers().values()]
        java_buffers = {str(k): np.asarray(v) for k, v in module.getBuffers().items()}
        assert {k: list(v) for k, v in java_buffers.items()} == {
            k: b.double().numpy().ravel().tolist() for k, b in eager.buffers().items()}
        assert java_buffers["steps"].tolist() == [5.0]
        # a snapshot (what the online learner and gradbridge-spark save from) copies them as they are
        access = jvm.jclass("dev.gradbridge.internal.ModuleAccess")  # library-internal calls, no API
        snapshot = access.snapshot(module).get()
        try:
            assert {str(k): list(v) for k, v in snapshot.getBuffers().items()} == {
                k: list(v) for k, v in java_buffers.items()}
            assert bytes(access.checkpointArchive(snapshot, None)) == bytes(access.checkpointArchive(module, None))
        finally:
            snapshot.close()
        assert [bool(b.isPersistent()) for b in module.getMetadata().getBuffers()] == [False] + [True] * 5
    finally:
        module.close()


def test_checkpoint_and_resume_keep_the_buffers_and_equal_eager(jvm, model, exported, tmp_path):
    x, y = labelled(48, FEATURES, tensors=True, labels="sum")
    halfway, checkpoint = tmp_path / "halfway.pt", tmp_path / "done.pt"
    first = java.train(exported, x.numpy(), y.numpy(), epochs=2, batch_size=16, checkpoint=halfway)
    rest = java.train(halfway, x.numpy(), y.numpy(), epochs=2, checkpoint=checkpoint)
    eager = reference.train(exported, x.numpy(), y.numpy(), epochs=4, batch_size=16, model=model)
    report = compare_histories(eager, History(first.records + rest.records), labels=("eager", "java resumed"))
    assert report.bitwise, report.table()
    # The checkpoint holds every buffer in its dtype: the constant ones as exported, steps counted on
    trained = torchscript.load(str(checkpoint))
    saved = dict(zip(trained.buffer_names(), trained.get_buffers()))
    for name in CONSTANT:
        original = getattr(model, name)
        assert saved[name].dtype == original.dtype and torch.equal(saved[name], original), name
    assert saved["steps"].dtype == torch.int32 and int(saved["steps"]) == 4 * 3  # 3 batches of 16 per epoch


def test_the_state_dict_leaves_out_the_non_persistent_buffer(jvm, model, exported, tmp_path):
    x, y = labelled(48, FEATURES, tensors=True, labels="sum")
    checkpoint = tmp_path / "trained.pt"
    java.train(exported, x.numpy(), y.numpy(), epochs=1, checkpoint=checkpoint)
    state = state_dict_of(checkpoint)
    assert list(state) == list(model.state_dict()) and "mask" not in state
    assert {k: v.dtype for k, v in state.items()} == {k: v.dtype for k, v in model.state_dict().items()}
    fresh = BufferDtypes()
    fresh.load_state_dict(state, strict=True)
    assert int(fresh.steps) == 2  # 2 batches of the default 32 on 48 samples


class ComplexBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(FEATURES, CLASSES)
        self.register_buffer("phase", torch.ones(CLASSES, dtype=torch.complex64))

    def forward(self, x):
        return self.linear(x) * self.phase.real


class ComplexParameter(nn.Module):
    """(float16 and bfloat16 parameters are taken: tests/test_low_precision.py.)"""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(FEATURES, CLASSES)
        self.phase = nn.Parameter(torch.ones(CLASSES, dtype=torch.complex64))

    def forward(self, x):
        return self.linear(x) * self.phase.real


@pytest.mark.parametrize("model, line", [
    (ComplexBuffer, messages.unsupported_dtype("buffer", "'phase'", "complex64", protocol.BUFFER_DTYPES)),
    (ComplexParameter, messages.unsupported_dtype("parameter", "'phase'", "complex64", protocol.PARAMETER_DTYPES)),
], ids=["complex-buffer", "complex-parameter"])
def test_a_dtype_gradbridge_cannot_carry_is_refused_at_export_with_one_line(tmp_path, model, line):
    with pytest.raises(DTypeError) as info:  # gradbridge's error type (a ValueError too)
        export_training_module(model(), "cross_entropy", ADAM, tmp_path / "refused.pt",
                               example_inputs=labelled(8, FEATURES, tensors=True, labels="sum"))
    assert str(info.value) == line
    assert not (tmp_path / "refused.pt").exists()
