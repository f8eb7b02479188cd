"""Exported optimizers against eager torch.optim, bit for bit.

For every optimizer configuration x {3-layer MLP, small CNN with BatchNorm, MLP with dropout}:
50 train_step calls on the scripted module driven from Python equal 50 eager torch.optim steps
exactly: losses, parameters, buffers and optimizer state after every step.
"""

from __future__ import annotations


import pytest
import torch

from gradbridge import export_training_module
from gradbridge.export import optim
from gradbridge.models import SmallCNN, mlp
from gradbridge.reference import Reference
from gradbridge.torchscript import plain_graph_executor
from tests.matrix import OPTIMIZER_VARIANTS as OPTIMIZERS

pytestmark = pytest.mark.every_torch  # Python-side parity: `make test` runs it on the newest torch too

STEPS = 50
BATCH = 16


MODELS = {
    "mlp": (lambda: mlp(in_features=6, hidden=(16, 16), out_features=3), (6,)),
    "cnn-batchnorm": (lambda: SmallCNN(side=8, channels=4, classes=3), (1, 8, 8)),
    "mlp-dropout": (lambda: mlp(in_features=6, hidden=(16, 16), out_features=3, dropout=0.3), (6,)),
}


def _data(shape, n=64, classes=3):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, *shape, generator=generator)
    y = torch.randint(0, classes, (n,), generator=generator)
    return x, y


def _assert_same(expected: dict, actual: dict, what: str, step: int):
    assert expected.keys() == actual.keys(), what
    for name in expected:
        assert torch.equal(expected[name], actual[name]), (
            f"step {step}: {what} {name} differs by {(expected[name] - actual[name]).abs().max().item():.3e}")


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=str)
@pytest.mark.parametrize("model_name", MODELS, ids=str)
def test_exported_optimizer_equals_torch_optim(tmp_path, optimizer, model_name):
    factory, shape = MODELS[model_name]
    torch.manual_seed(0)
    model = factory()
    x, y = _data(shape)
    path = export_training_module(model, "cross_entropy", OPTIMIZERS[optimizer], tmp_path / "m.pt",
                                  example_inputs=(x[:BATCH], y[:BATCH]))

    # Given the eager model, torch.optim and the exported module, from the same initial tensors
    reference = Reference(path, model)
    scripted = torch.jit.load(str(path))
    names = scripted.parameter_names()
    buffer_names = scripted.buffer_names()
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]

    # When each takes STEPS steps with the same generator state (dropout draws the same masks)
    torch.manual_seed(1234)
    eager = []
    for step in range(STEPS):
        loss = reference.train_step(*batches[step % len(batches)])
        eager.append((loss, reference.parameters(), reference.buffers(), reference.optimizer_state()))
    torch.manual_seed(1234)
    with plain_graph_executor():
        for step in range(STEPS):
            loss = scripted.train_step(*batches[step % len(batches)])
            expected_loss, params, buffers, state = eager[step]
            # Then every step agrees exactly
            assert torch.equal(loss, expected_loss), f"step {step}: loss {loss.item()!r} vs {expected_loss.item()!r}"
            _assert_same(params, dict(zip(names, scripted.get_parameters())), "parameter", step)
            _assert_same(buffers, dict(zip(buffer_names, scripted.get_buffers())), "buffer", step)
            exported_state = scripted.optimizer_state()
            for key, values in state.items():
                _assert_same({i: v for i, v in enumerate(values)}, dict(enumerate(exported_state[key])),
                             f"optimizer state {key}", step)
    if model_name == "cnn-batchnorm":
        assert any("running_mean" in n for n in buffer_names)


def test_shared_parameters_are_updated_once(tmp_path):
    from gradbridge.models import SharedWeights

    torch.manual_seed(0)
    model = SharedWeights()
    x, y = _data((4,))
    path = export_training_module(model, "cross_entropy", {"name": "adam", "lr": 0.01}, tmp_path / "m.pt",
                                  example_inputs=(x, y))
    scripted = torch.jit.load(str(path))
    assert scripted.parameter_names() == ["first.weight", "first.bias", "second.bias", "head.weight", "head.bias"]
    reference = Reference(path, model)
    with plain_graph_executor():
        for _ in range(20):
            assert torch.equal(scripted.train_step(x, y), reference.train_step(x, y))
    _assert_same(reference.parameters(), dict(zip(scripted.parameter_names(), scripted.get_parameters())),
                 "parameter", 20)


def test_optimizer_state_round_trip_equals_uninterrupted_training(tmp_path):
    torch.manual_seed(0)
    model = mlp(in_features=6, hidden=(16, 16), out_features=3, dropout=0.2)
    x, y = _data((6,))
    spec = {"name": "adam", "lr": 1e-2, "amsgrad": True}
    first = export_training_module(model, "cross_entropy", spec, tmp_path / "a.pt", example_inputs=(x, y))
    second = export_training_module(model, "cross_entropy", spec, tmp_path / "b.pt", example_inputs=(x, y))
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]

    with plain_graph_executor():
        torch.manual_seed(7)
        uninterrupted = torch.jit.load(str(first))
        losses = [uninterrupted.train_step(*batches[s % 4]) for s in range(50)]

        torch.manual_seed(7)
        before = torch.jit.load(str(second))
        resumed_losses = [before.train_step(*batches[s % 4]) for s in range(20)]
        torch.save({"optimizer": before.optimizer_state(), "parameters": before.get_parameters()},
                   tmp_path / "state.pt")
        saved = torch.load(tmp_path / "state.pt")
        state, params = saved["optimizer"], saved["parameters"]
        after = torch.jit.load(str(second))  # a fresh copy of the initial export
        after.set_parameters(params)
        after.load_optimizer_state(state)
        resumed_losses += [after.train_step(*batches[s % 4]) for s in range(20, 50)]

    assert all(torch.equal(a, b) for a, b in zip(losses, resumed_losses))
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted.get_parameters(), after.get_parameters()))


def test_train_epoch_equals_the_same_batches_stepped_one_by_one(tmp_path):
    torch.manual_seed(0)
    model = SmallCNN(side=8, channels=4, classes=3)
    x, y = _data((1, 8, 8), n=50)
    path = export_training_module(model, "cross_entropy", {"name": "sgd", "lr": 0.1, "momentum": 0.9},
                                  tmp_path / "m.pt", example_inputs=(x, y))
    perm = torch.randperm(50, generator=torch.Generator().manual_seed(3))
    with plain_graph_executor():
        fused, stepped = torch.jit.load(str(path)), torch.jit.load(str(path))
        fused_losses = fused.train_epoch(x, y, perm, 16)  # 16 + 16 + 16 + 2
        stepped_losses = [stepped.train_step(x.index_select(0, perm[i:i + 16]), y.index_select(0, perm[i:i + 16]))
                          for i in range(0, 50, 16)]
    assert fused_losses.shape == (4,)
    assert torch.equal(fused_losses, torch.stack(stepped_losses))
    assert all(torch.equal(a, b) for a, b in zip(fused.get_parameters(), stepped.get_parameters()))
    assert all(torch.equal(a, b) for a, b in zip(fused.get_buffers(), stepped.get_buffers()))


def test_lr_can_be_read_and_changed(tmp_path):
    torch.manual_seed(0)
    x, y = _data((6,))
    path = export_training_module(mlp(6, (8,), 3), "cross_entropy", {"name": "adamw", "lr": 0.003}, tmp_path / "m.pt",
                                  example_inputs=(x, y))
    scripted = torch.jit.load(str(path))
    assert scripted.get_lr() == 0.003
    scripted.set_lr(0.5)
    assert scripted.get_lr() == 0.5
    with pytest.raises(torch.jit.Error, match="set_lr: invalid learning rate -1"):
        scripted.set_lr(-1.0)


def test_torch_optim_instances_and_loss_modules_are_accepted(tmp_path):
    torch.manual_seed(0)
    model = mlp(6, (8,), 3)
    x, y = _data((6,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    path = export_training_module(model, loss, optimizer, tmp_path / "m.pt", example_inputs=(x, y))
    from gradbridge import protocol

    metadata = protocol.read_metadata(path)
    assert metadata["optimizer"] == {"name": "sgd", "lr": 0.1, "momentum": 0.9, "dampening": 0, "weight_decay": 1e-4,
                                     "nesterov": True, "maximize": False}
    assert metadata["loss"] == {"name": "cross_entropy", "reduction": "mean", "weight": None, "ignore_index": -100,
                                "label_smoothing": 0.1}


@pytest.mark.parametrize("name", sorted(optim.OPTIMIZERS))
def test_scripted_optimizer_docstring_names_its_torch_class(name):
    cls = optim.OPTIMIZERS[name]
    assert f"torch.optim.{cls.torch_name}" in cls.__doc__
