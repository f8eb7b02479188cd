"""The exporter: protocol methods, metadata, first-call behaviour, atomic writes, bad options."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import pytest

from gradbridge import export_builtin, protocol
from gradbridge.errors import ProtocolError
from gradbridge.models import LinearRegression
from gradbridge._runtime.torchscript import plain_graph_executor


@pytest.fixture
def scripted(model_path):
    with plain_graph_executor():
        yield torch.jit.load(str(model_path))


def test_every_protocol_method_is_scripted(scripted, model_path):
    for method in protocol.REQUIRED_METHODS:
        assert hasattr(scripted, method), method
    for method in protocol.OPTIONAL_METHODS + protocol.DATA_PARALLEL_METHODS:
        assert hasattr(scripted, method), method
    assert protocol.read_metadata(model_path)["methods"] == list(
        protocol.REQUIRED_METHODS + protocol.OPTIONAL_METHODS + protocol.DATA_PARALLEL_METHODS)


def test_metadata_describes_the_module(model_path):
    metadata = protocol.read_metadata(model_path)
    assert tuple(metadata) == protocol.METADATA_KEYS + (protocol.CAPTURE_KEY,)
    assert metadata[protocol.CAPTURE_KEY] == {"kind": "script", "checked": True, protocol.DRAWS_RANDOM_KEY: False}
    assert metadata["torch_version"] == torch.__version__.split("+")[0]
    assert metadata["parameters"] == [
        {"name": "weight", "shape": [1], "dtype": "float32", "trainable": True},
        {"name": "bias", "shape": [1], "dtype": "float32", "trainable": True},
    ]
    assert metadata["loss"] == {"name": "mse", "reduction": "mean"}
    assert metadata["optimizer"] == {"name": "sgd", "lr": 0.01, "momentum": 0.0, "dampening": 0.0,
                                     "weight_decay": 0.0, "nesterov": False, "maximize": False}
    assert [i["name"] for i in metadata["inputs"]] == ["x", "y"]


def test_first_call_works_and_gradients_equal_eager_autograd(scripted):
    # The seed's `if grad is not None: grad.zero_()` fails here on the first call; ours must not.
    torch.manual_seed(1)
    x, y = torch.rand(16, 1) * 10, torch.rand(16, 1)
    loss = scripted.calculate_loss_and_backward(x, y)

    eager = LinearRegression()
    with torch.no_grad():
        for p, value in zip(eager.parameters(), scripted.get_parameters()):
            p.copy_(value)
    expected = F.mse_loss(eager(x), y)
    expected.backward()
    assert torch.equal(loss, expected.detach())
    for grad, p in zip(scripted.get_gradients(), eager.parameters()):
        assert torch.equal(grad, p.grad)


def test_sgd_step_matches_torch_optim_and_consumes_gradients(scripted):
    x, y = torch.arange(4.0).reshape(4, 1), torch.ones(4, 1)
    eager = LinearRegression()
    with torch.no_grad():
        for p, value in zip(eager.parameters(), scripted.get_parameters()):
            p.copy_(value)
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.05)
    for _ in range(3):
        scripted.calculate_loss_and_backward(x, y)
        scripted.sgd_step(0.05)
        optimizer.zero_grad()
        F.mse_loss(eager(x), y).backward()
        optimizer.step()
    for value, p in zip(scripted.get_parameters(), eager.parameters()):
        assert torch.equal(value, p.detach())
    assert all(torch.count_nonzero(g) == 0 for g in scripted.get_gradients())


def test_same_seed_same_initial_parameters(tmp_path):
    a = export_builtin("linear-regression", tmp_path / "a.pt", seed=7)
    b = export_builtin("linear-regression", tmp_path / "b.pt", seed=7)
    c = export_builtin("linear-regression", tmp_path / "c.pt", seed=8)
    values = [torch.jit.load(str(p)).get_parameters()[0] for p in (a, b, c)]
    assert torch.equal(values[0], values[1]) and not torch.equal(values[0], values[2])


def test_bad_options_fail_before_anything_is_written(tmp_path):
    existing = tmp_path / "model.pt"
    existing.write_bytes(b"previous content")
    with pytest.raises(ValueError, match="Invalid learning rate: -0.1"):
        export_builtin("linear-regression", existing, lr=-0.1)
    with pytest.raises(ValueError, match="Unknown built-in model 'resnet'"):
        export_builtin("resnet", existing)
    assert existing.read_bytes() == b"previous content"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no temporary file left behind


def test_failed_save_leaves_the_existing_file_whole(tmp_path, monkeypatch):
    existing = tmp_path / "model.pt"
    existing.write_bytes(b"previous content")

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch.jit, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export_builtin("linear-regression", existing)
    assert existing.read_bytes() == b"previous content"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_read_metadata_names_the_file(models):
    with pytest.raises(ProtocolError, match=r"not_torchscript\.pt: not a TorchScript archive"):
        protocol.read_metadata(models["not_torchscript.pt"])
    with pytest.raises(ProtocolError, match=r"no_protocol\.pt: TorchScript archive without gradbridge\.json"):
        protocol.read_metadata(models["no_protocol.pt"])


# ---- General export: any nn.Module, loss and optimizer ----

from gradbridge import export_training_module  # noqa: E402
from gradbridge.export import ExportError  # noqa: E402
from gradbridge.models import mlp  # noqa: E402
from gradbridge.reference import Reference  # noqa: E402
from tests.models.custom import UNSCRIPTABLE_LINE, Unscriptable  # noqa: E402

pytestmark = pytest.mark.every_torch  # Python-side parity: `make test` runs it on the newest torch too


def _classification_batch(features=4, classes=3, n=10):
    generator = torch.Generator().manual_seed(5)
    return torch.randn(n, features, generator=generator), torch.randint(0, classes, (n,), generator=generator)


@pytest.mark.parametrize("loss, optimizer, message", [
    ("hinge", "sgd", "Unknown loss 'hinge'; supported: mse, l1, smooth_l1"),
    ("cross_entropy", "lbfgs", "Unknown optimizer 'lbfgs'; supported: sgd, adam, adamw, rmsprop, adagrad"),
    ("cross_entropy", {"name": "sgd", "lr": -0.1}, "Invalid learning rate: -0.1"),
    ("cross_entropy", {"name": "adam", "betas": [0.9, 1.0]}, "Invalid beta parameter at index 1: 1.0"),
    ("cross_entropy", {"name": "adam", "betas": [-0.1, 0.9]}, "Invalid beta parameter at index 0: -0.1"),
    ("cross_entropy", {"name": "sgd", "nesterov": True}, "Nesterov momentum requires a momentum and zero dampening"),
    ("mse", "sgd", "loss mse needs a target of dtype float32, float64, bfloat16 or float16, got int64"),
    ("bce_with_logits", "adam", "loss bce_with_logits needs a target of dtype float32, float64, bfloat16 or float16, got int64"),
])
def test_bad_export_options_fail_before_anything_is_written(tmp_path, loss, optimizer, message):
    existing = tmp_path / "model.pt"
    existing.write_bytes(b"previous content")
    with pytest.raises(ValueError, match=message):
        export_training_module(mlp(4, (8,), 3), loss, optimizer, existing, example_inputs=_classification_batch())
    assert existing.read_bytes() == b"previous content"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_class_targets_need_int64(tmp_path):
    x, y = _classification_batch()
    with pytest.raises(ValueError, match="loss cross_entropy needs a target of dtype int64, got float32"):
        export_training_module(mlp(4, (8,), 3), "cross_entropy", "sgd", tmp_path / "m.pt",
                               example_inputs=(x, y.float()))


def test_unscriptable_model_names_the_construct_and_line(tmp_path):
    with pytest.raises(ExportError) as info:
        export_training_module(Unscriptable(), "cross_entropy", "adam", tmp_path / "m.pt",
                               inputs=[protocol.tensor_spec("x", [-1, 4], "float32"),
                                       protocol.tensor_spec("y", [-1], "int64")])
    message = str(info.value)
    assert "cannot script Unscriptable" in message
    assert "try blocks aren't supported" in message
    assert f"custom.py\", line {UNSCRIPTABLE_LINE}" in message
    assert "pass example_inputs=(x, y) to trace it instead" in message
    assert "\n" not in message
    assert not (tmp_path / "m.pt").exists()


def test_unscriptable_model_is_traced_with_example_inputs(tmp_path):
    torch.manual_seed(0)
    model = Unscriptable()
    x, y = _classification_batch()
    path = export_training_module(model, "cross_entropy", {"name": "adam", "lr": 0.01}, tmp_path / "m.pt",
                                  example_inputs=(x, y))
    scripted = torch.jit.load(str(path))
    reference = Reference(path, model)
    with plain_graph_executor():
        for _ in range(10):
            assert torch.equal(scripted.train_step(x, y), reference.train_step(x, y))
    for value, expected in zip(scripted.get_parameters(), reference.parameters().values()):
        assert torch.equal(value, expected)


def test_export_does_not_modify_the_users_model(tmp_path):
    torch.manual_seed(0)
    model = mlp(4, (8,), 3)
    before = [p.detach().clone() for p in model.parameters()]
    path = export_training_module(model, "cross_entropy", "sgd", tmp_path / "m.pt", example_inputs=_classification_batch())
    scripted = torch.jit.load(str(path))
    scripted.train_step(*_classification_batch())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_metadata_is_complete_for_a_general_model(tmp_path):
    from gradbridge.models import SmallCNN

    torch.manual_seed(0)
    x = torch.randn(4, 1, 8, 8)
    y = torch.randint(0, 10, (4,))
    path = export_training_module(SmallCNN(), torch.nn.CrossEntropyLoss(label_smoothing=0.1),
                                  {"name": "adamw", "lr": 0.002}, tmp_path / "cnn.pt", example_inputs=(x, y))
    metadata = protocol.read_metadata(path)
    assert metadata["model"] == "SmallCNN"
    assert metadata["inputs"] == [{"name": "x", "shape": [-1, 1, 8, 8], "dtype": "float32"},
                                  {"name": "y", "shape": [-1], "dtype": "int64"}]
    buffers = metadata["buffers"]
    assert {"name": "features.1.running_mean", "shape": [8], "dtype": "float32", "persistent": True, "trained": True} in buffers
    assert {"name": "features.1.num_batches_tracked", "shape": [], "dtype": "int64", "persistent": True, "trained": True} in buffers
    assert metadata["parameters"][0] == {"name": "features.0.weight", "shape": [8, 1, 3, 3], "dtype": "float32",
                                      "trainable": True}
    assert metadata["optimizer"] == {"name": "adamw", "lr": 0.002, "betas": [0.9, 0.999], "eps": 1e-8,
                                     "weight_decay": 0.01, "amsgrad": False, "maximize": False}
    assert metadata["loss"]["label_smoothing"] == 0.1
