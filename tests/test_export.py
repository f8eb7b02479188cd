"""The exporter: protocol methods, metadata, first-call behaviour, atomic writes, bad options."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import pytest

from gradbridge import export_builtin, protocol
from gradbridge.errors import ProtocolError
from gradbridge.models import LinearRegression
from gradbridge.torchscript import plain_graph_executor


@pytest.fixture
def scripted(model_path):
    with plain_graph_executor():
        yield torch.jit.load(str(model_path))


def test_every_protocol_method_is_scripted(scripted, model_path):
    for method in protocol.REQUIRED_METHODS:
        assert hasattr(scripted, method), method
    assert protocol.read_metadata(model_path)["methods"] == list(protocol.REQUIRED_METHODS)


def test_metadata_describes_the_module(model_path):
    metadata = protocol.read_metadata(model_path)
    assert tuple(metadata) == protocol.METADATA_KEYS
    assert metadata["torch_version"] == torch.__version__.split("+")[0]
    assert metadata["parameters"] == [
        {"name": "weight", "shape": [1], "dtype": "float32"},
        {"name": "bias", "shape": [1], "dtype": "float32"},
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
