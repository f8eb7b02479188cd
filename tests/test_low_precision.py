"""bfloat16 and float16 parameters, as LLMs are fine-tuned: ``model.to(torch.bfloat16)`` with AdamW
(its state of the parameters' dtype, as torch.optim keeps it), a model whose dtypes mix, a tiny
transformer; exported in both formats, trained from Java bit for bit like eager PyTorch on the CPU,
checkpointed and resumed; digests of their 2-byte words, history values widened exactly."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import torch
from torch import nn

from gradbridge import compare_histories, export_training_module, java, protocol, reference
from gradbridge.errors import DTypeError, GradbridgeError
from gradbridge.history import digest

from .data import labelled

FORMATS = ["torchscript", "export"]


class Net(nn.Module):
    """Inputs arrive as float32 (data files have no bfloat16): the model casts them, as a user's does."""

    def __init__(self, head_dtype=None):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)
        self.head_dtype = head_dtype

    def forward(self, x):
        h = self.body(x.to(self.body[0].weight.dtype))
        return self.head(h.to(self.head.weight.dtype)).float()


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.layer(self.embed(x.to(self.embed.weight.dtype)))
        return self.head(h.mean(1)).float()


def _bf16_mlp():
    torch.manual_seed(0)
    return Net().to(torch.bfloat16)


def _mixed():
    torch.manual_seed(0)
    model = Net()
    model.body.to(torch.bfloat16)  # bf16 weights, a float32 head
    return model


def _tiny_transformer():
    torch.manual_seed(0)
    return TinyTransformer().to(torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("make,shape", [(_bf16_mlp, (6,)), (_mixed, (6,)), (_tiny_transformer, (5, 4))],
                         ids=["bf16-mlp", "bf16-body-fp32-head", "bf16-transformer"])
def test_bfloat16_trains_bitwise_from_java_and_resumes(jvm, tmp_path, fmt, make, shape):
    model = make()
    x, y = labelled(32, shape, tensors=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x[:8], y[:8]),
                                  format=fmt)
    dtypes = {p["name"]: p["dtype"] for p in protocol.read_metadata(path)["parameters"]}
    assert dtypes == {name: str(p.dtype).replace("torch.", "") for name, p in model.named_parameters()}
    settings = dict(epochs=3, batch_size=8, seed=1)
    in_java = java.train(path, x.numpy(), y.numpy(), **settings)
    in_python = reference.train(path, x.numpy(), y.numpy(), model=model, **settings)
    assert compare_histories(in_python, in_java).bitwise
    # the digests hash the parameters' own words
    trained = {name: torch.from_numpy(values.copy()).to(getattr(torch, dtypes[name]))
               for name, values in in_java[-1].parameters.items()}
    assert in_java[-1].digests == {name: digest(t, dtypes[name]) for name, t in trained.items()}
    # checkpointed after 2 epochs, resumed for the third: the same bits, and AdamW's state in bfloat16
    java.train(path, x.numpy(), y.numpy(), epochs=2, batch_size=8, seed=1, checkpoint=tmp_path / "c.pt")
    resumed = java.train(tmp_path / "c.pt", x.numpy(), y.numpy(), epochs=1)
    assert resumed[0].digests == in_java[2].digests
    if fmt == "torchscript":
        state = torch.jit.load(str(tmp_path / "c.pt")).optimizer_state()
        assert [t.dtype for t in state["exp_avg"]] == [p.dtype for p in model.parameters()]


@pytest.mark.parametrize("fmt", FORMATS)
def test_float16_parameters_train_bitwise_where_torch_has_cpu_kernels(jvm, tmp_path, fmt):
    torch.manual_seed(0)
    model = Net().half()
    x, y = labelled(32, tensors=True)
    try:
        model(x[:2]).sum().backward()
    except RuntimeError as ex:  # an older torch without float16 CPU kernels for these ops
        pytest.skip(f"torch {torch.__version__} has no float16 CPU kernel here: {ex}")
    model.zero_grad(set_to_none=True)
    path = export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters(), lr=0.01, eps=1e-3),
                                  tmp_path / "m.pt", example_inputs=(x[:8], y[:8]), format=fmt)
    in_java = java.train(path, x.numpy(), y.numpy(), epochs=2, batch_size=8)
    in_python = reference.train(path, x.numpy(), y.numpy(), epochs=2, batch_size=8, model=model)
    assert compare_histories(in_python, in_java).bitwise


def test_16_bit_optimizer_state_scaled_by_a_float_equals_torch_optim(tmp_path):
    """TorchScript's ``mul_(float)`` (``aten::mul_.Scalar``) rounds the factor to a 16-bit tensor's dtype, eager's
    multiplies by it in float32: SGD's momentum 0.9 in bfloat16 and Adam's beta2 0.999 in float16 drifted from
    torch.optim (``spec/scaling.py``; issue 46). 30 steps of the scripted optimizers, bit for bit."""
    from gradbridge import verify

    x, y = labelled(64, tensors=True)
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)] * 4
    for dtype, make in [(torch.bfloat16, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
                        (torch.float16, lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-3)),
                        (torch.float16, lambda p: torch.optim.RMSprop(p, lr=0.01, eps=1e-3, momentum=0.5))]:
        torch.manual_seed(0)
        model = Net().to(dtype)
        path = export_training_module(model, "cross_entropy", make(model.parameters()), tmp_path / "m.pt",
                                      example_inputs=(x[:8], y[:8]), format="torchscript")
        assert verify.optimizer_difference(path, model, batches, 30) is None, (dtype, make)


@pytest.mark.parametrize("dtype,make", [
    (torch.bfloat16, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    (torch.float16, lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-3)),
    (torch.bfloat16, lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
    (torch.float16, lambda p: torch.optim.RMSprop(p, lr=0.01, eps=1e-3, momentum=0.5))],
    ids=["bf16-sgd-momentum", "fp16-adam", "bf16-adamw-decay", "fp16-rmsprop-momentum"])
def test_16_bit_optimizer_state_scaled_by_a_float_trains_bitwise_in_protocol_3(jvm, tmp_path, dtype, make):
    """Protocol 3's step graph scales a 16-bit state as eager ``mul_(float)`` does: ``aten::mul_.Tensor`` by a
    wrapped number (a constant: Adam's beta2, RMSprop's alpha) or by a 0-dim float64 tensor (a host scalar:
    SGD's and RMSprop's momentum, AdamW's decay, through ``aten::scalar_tensor``), multiplied in float32, where
    ``aten::mul_.Scalar`` rounds the factor to the dtype (its check refused a bfloat16 SGD with momentum 0.9 at
    export). Trained from Java bit for bit like eager torch.optim, and resumed from a checkpoint."""
    torch.manual_seed(0)
    model = Net().to(dtype)
    x, y = labelled(32, tensors=True)
    if dtype == torch.float16:
        try:
            model(x[:2]).sum().backward()
        except RuntimeError as ex:  # an older torch without float16 CPU kernels for these ops
            pytest.skip(f"torch {torch.__version__} has no float16 CPU kernel here: {ex}")
        model.zero_grad(set_to_none=True)
    path = export_training_module(model, "cross_entropy", make(model.parameters()), tmp_path / "m.pt",
                                  example_inputs=(x[:8], y[:8]), format="export")
    with zipfile.ZipFile(path) as archive:
        step = json.loads(archive.read("graphs/optimizer.json"))
    ops = {f"{node['op']}.{node['overload']}" for node in step["nodes"]}
    assert "aten::mul_.Tensor" in ops and "aten::mul_.Scalar" not in ops
    settings = dict(epochs=3, batch_size=8, seed=1)
    in_java = java.train(path, x.numpy(), y.numpy(), **settings)
    in_python = reference.train(path, x.numpy(), y.numpy(), model=model, **settings)
    assert compare_histories(in_python, in_java).bitwise
    java.train(path, x.numpy(), y.numpy(), epochs=2, batch_size=8, seed=1, checkpoint=tmp_path / "c.pt")
    resumed = java.train(tmp_path / "c.pt", x.numpy(), y.numpy(), epochs=1)
    assert resumed[0].digests == in_java[2].digests


def test_a_dtype_gradbridge_does_not_take_is_its_error_in_one_line(tmp_path):
    """int32 inputs (bfloat16 ones are taken: tests/test_low_precision_data.py) and complex parameters."""
    model = _bf16_mlp()
    with pytest.raises(DTypeError) as error:
        export_training_module(model, "cross_entropy", {"name": "sgd"}, tmp_path / "m.pt",
                               example_inputs=(torch.ones(4, 6, dtype=torch.int32), torch.zeros(4).long()))
    assert str(error.value) == "input 'x' has dtype int32, which gradbridge does not support; inputs may be " \
                               "float32, float64, int64, bfloat16, float16"
    with pytest.raises(DTypeError, match="^parameter 'weight' has dtype complex64, which gradbridge does not support; "
                                         "parameters may be float32, float64, int64, bfloat16, float16$"):
        protocol.tensor_spec("weight", [2, 2], "complex64", kind="parameter")
    assert isinstance(error.value, GradbridgeError) and list(tmp_path.iterdir()) == []


def test_bfloat16_digests_hash_the_16_bit_words():
    values = torch.tensor([1.0, -2.5, 3.0e38, 1e-40], dtype=torch.bfloat16)
    words = values.view(torch.int16).numpy().astype("<i2").tobytes()
    import hashlib

    assert digest(values, "bfloat16") == hashlib.sha256(words).hexdigest()
    assert digest(values.double().numpy(), "bfloat16") == digest(values, "bfloat16")  # widened values, same digest
    half = torch.tensor([1.0, -2.5, 6.0e-8, 65504.0], dtype=torch.float16)
    assert digest(half, "float16") == hashlib.sha256(half.numpy().astype("<f2").tobytes()).hexdigest()
    assert np.isfinite(half.double().numpy()).all()
