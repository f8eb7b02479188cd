"""Fine-tuning, bit for bit: frozen parameters, parameter groups, gradient clipping and
accumulation, trained from Java in this process (JPype) against eager torch.optim / torch.nn.utils
(`gradbridge.reference`); plus the scripted optimizers per group against torch.optim directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradbridge import export_training_module, java, protocol, reference
from gradbridge.reference import Reference
from gradbridge._runtime.torchscript import plain_graph_executor

from .data import labelled

#: the data's settings: 4 classes ordered by a linear score of the features (tests/data.py)
SCORES = dict(tensors=True, labels="score", classes=4)


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def _train_both(path, model, x, y, **settings):
    settings = {"epochs": 4, "batch_size": 16, "seed": 3, "mode": "step", **settings}
    in_java = java.train(path, x.numpy(), y.numpy(), **settings)
    in_python = reference.train(path, x.numpy(), y.numpy(), model=model, **settings)
    return in_java, in_python


def _assert_bitwise(in_java, in_python):
    assert len(in_java) == len(in_python) > 0
    for a, b in zip(in_java, in_python):
        assert a.loss == b.loss, a.epoch
        assert a.val_loss == b.val_loss, a.epoch
        assert a.digests == b.digests, a.epoch
        assert a.lrs == b.lrs and a.lrs is not None, a.epoch


def test_frozen_parameters_never_change_and_train_bitwise_from_java(jvm, tmp_path):
    # Given an MLP whose first layer is frozen, exported with Adam over the trainable parameters
    model = _model()
    model[0].weight.requires_grad_(False)
    model[0].bias.requires_grad_(False)
    x, y = labelled(96, **SCORES)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y))

    # Then the metadata says which parameters train, and Java reads it
    metadata = protocol.read_metadata(path)
    assert [p["trainable"] for p in metadata["parameters"]] == [False, False, True, True, True, True]
    module = jvm.load_module(path)
    try:
        assert [str(n) for n in module.getMetadata().getTrainableParameterNames()] == ["2.weight", "2.bias",
                                                                                  "4.weight", "4.bias"]
    finally:
        module.close()

    # When Java and eager torch.optim train it
    in_java, in_python = _train_both(path, model, x, y)

    # Then they agree bit for bit, and the frozen layer still holds its initial values
    _assert_bitwise(in_java, in_python)
    assert np.array_equal(in_java[-1].parameters["0.weight"], model[0].weight.detach().double().numpy().ravel())
    assert not np.array_equal(in_java[-1].parameters["2.weight"], model[2].weight.detach().double().numpy().ravel())


def test_frozen_parameters_have_no_gradient_and_no_optimizer_state(tmp_path):
    model = _model()
    model[0].weight.requires_grad_(False)
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", {"name": "adam", "lr": 0.01}, tmp_path / "m.pt",
                                  example_inputs=(x, y))
    scripted = torch.jit.load(str(path))
    with plain_graph_executor():
        scripted.calculate_loss_and_backward(x, y)
        gradients = scripted.get_gradients()
        assert not gradients[0].any() and gradients[1].any()
        scripted.optimizer_step()
    # torch.optim keeps state only for parameters that stepped: 5 of the 6 here (Adam: no AMSGrad buffer)
    assert {key: len(v) for key, v in scripted.optimizer_state().items()} == {"step": 5, "exp_avg": 5, "exp_avg_sq": 5}
    assert torch.equal(scripted.get_parameters()[0], model[0].weight)


def test_freeze_by_prefix(tmp_path):
    x, y = labelled(96, **SCORES)
    path = export_training_module(_model(), "cross_entropy", {"name": "sgd", "lr": 0.1}, tmp_path / "m.pt",
                                  example_inputs=(x, y), freeze=["0.", "2.bias"])
    assert [p["name"] for p in protocol.read_metadata(path)["parameters"] if not p["trainable"]] == [
        "0.weight", "0.bias", "2.bias"]


GROUP_OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05}, [{"lr": 0.01, "momentum": 0.9, "nesterov": True}, {"weight_decay": 1e-3}]),
    "adam": (torch.optim.Adam, {"lr": 0.01}, [{"lr": 0.001, "betas": (0.8, 0.99), "amsgrad": True},
                                              {"eps": 1e-6, "weight_decay": 1e-2}]),
    "adamw": (torch.optim.AdamW, {"lr": 0.01}, [{"lr": 1e-4}, {"weight_decay": 0.0}]),
    "rmsprop": (torch.optim.RMSprop, {"lr": 0.01}, [{"alpha": 0.9, "centered": True}, {"momentum": 0.5, "lr": 0.001}]),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.05}, [{"lr_decay": 1e-3}, {"initial_accumulator_value": 0.1, "eps": 1e-8}]),
}


def _grouped(model, cls, defaults, options):
    backbone = [model[0].weight, model[0].bias, model[2].weight, model[2].bias]
    head = list(model[4].parameters())
    return cls([{"params": backbone, **options[0]}, {"params": head, **options[1]}], **defaults)


@pytest.mark.parametrize("name", GROUP_OPTIMIZERS)
def test_parameter_groups_equal_torch_optim(tmp_path, name):
    # Given an optimizer with two groups and their own options, exported, and the same eagerly
    cls, defaults, options = GROUP_OPTIMIZERS[name]
    model = _model()
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", _grouped(model, cls, defaults, options), tmp_path / "m.pt",
                                  example_inputs=(x, y))
    scripted = torch.jit.load(str(path))
    eager = _model()
    optimizer = _grouped(eager, cls, defaults, options)
    loss = nn.CrossEntropyLoss()
    # When both take 30 steps
    with plain_graph_executor():
        for step in range(30):
            xb, yb = x[step % 6 * 16:(step % 6 + 1) * 16], y[step % 6 * 16:(step % 6 + 1) * 16]
            scripted_loss = scripted.train_step(xb, yb)
            optimizer.zero_grad()
            eager_loss = loss(eager(xb), yb)
            eager_loss.backward()
            optimizer.step()
            # Then losses and parameters are bitwise equal after every step
            assert torch.equal(scripted_loss, eager_loss.detach()), step
            for mine, theirs in zip(scripted.get_parameters(), eager.parameters()):
                assert torch.equal(mine, theirs), step
    assert scripted.get_lrs() == [g["lr"] for g in optimizer.param_groups]


def test_parameter_groups_from_java_with_lr_per_group(jvm, tmp_path):
    # Given AdamW with a slow backbone and a head without weight decay (the example)
    model = _model()
    x, y = labelled(96, **SCORES)
    optimizer = _grouped(model, torch.optim.AdamW, {"lr": 1e-2}, [{"lr": 1e-4}, {"weight_decay": 0.0}])
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y))
    groups = protocol.read_metadata(path)["optimizer"]["groups"]
    assert [g["params"] for g in groups] == [["0.weight", "0.bias", "2.weight", "2.bias"], ["4.weight", "4.bias"]]
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [(1e-4, 1e-2), (1e-2, 0.0)]

    # Then Java reads and sets the lr per group
    module = jvm.load_module(path)
    try:
        assert list(module.getLrs()) == [1e-4, 1e-2]
        module.setLr(1, 0.5)
        assert list(module.getLrs()) == [1e-4, 0.5]
        module.setLr(0.25)
        assert list(module.getLrs()) == [0.25, 0.25]
    finally:
        module.close()

    # And training from Java equals torch.optim with the groups, the history holding both lrs
    in_java, in_python = _train_both(path, model, x, y, mode="fused")
    _assert_bitwise(in_java, in_python)
    assert in_java[0].lrs == [1e-4, 1e-2]


@pytest.mark.parametrize("clip", [{"clip_grad_norm": 0.05}, {"clip_grad_norm": 0.02, "clip_norm_type": float("inf")},
                                  {"clip_grad_value": 0.01}], ids=["norm-2", "norm-inf", "value"])
def test_gradient_clipping_from_java_equals_torch_nn_utils(jvm, tmp_path, clip):
    model = _model()
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", {"name": "sgd", "lr": 0.5, "momentum": 0.9},
                                  tmp_path / "m.pt", example_inputs=(x, y), **clip)
    in_java, in_python = _train_both(path, model, x, y)
    _assert_bitwise(in_java, in_python)
    # the clip changed the run: without it the parameters end elsewhere
    plain = export_training_module(model, "cross_entropy", {"name": "sgd", "lr": 0.5, "momentum": 0.9},
                                   tmp_path / "plain.pt", example_inputs=(x, y))
    assert java.train(plain, x.numpy(), y.numpy(), epochs=4, batch_size=16, seed=3)[-1].digests != in_java[-1].digests


@pytest.mark.parametrize("mode", ["step", "fused", "full"])
def test_gradient_accumulation_from_java_equals_the_eager_loop(jvm, tmp_path, mode):
    # Given 4 micro-batches per optimizer step (batch 32 -> 4 x 8 rows), with clipping too
    model = _model()
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", {"name": "adam", "lr": 0.01}, tmp_path / "m.pt",
                                  example_inputs=(x, y), accumulate=4, clip_grad_norm=1.0)
    in_java, in_python = _train_both(path, model, x, y, batch_size=32, mode=mode)
    _assert_bitwise(in_java, in_python)


def test_accumulation_is_the_eager_loop_of_micro_batches(tmp_path):
    # The reference's loop written out by hand: (loss / k).backward() per micro-batch, then step
    model = _model()
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", {"name": "sgd", "lr": 0.1}, tmp_path / "m.pt",
                                  example_inputs=(x, y), accumulate=3)
    scripted = torch.jit.load(str(path))
    eager = _model()
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
    with plain_graph_executor():
        for step in range(5):
            xb, yb = x[step * 18:(step + 1) * 18], y[step * 18:(step + 1) * 18]
            total = scripted.train_step(xb, yb)
            optimizer.zero_grad()
            expected = None
            for xm, ym in zip(xb.split(6), yb.split(6)):
                scaled = nn.functional.cross_entropy(eager(xm), ym) / 3
                scaled.backward()
                expected = scaled.detach() if expected is None else expected + scaled.detach()
            optimizer.step()
            assert torch.equal(total, expected)
            assert all(torch.equal(a, b) for a, b in zip(scripted.get_parameters(), eager.parameters()))


def test_reference_without_a_model_reads_frozen_flags_from_the_metadata(tmp_path):
    model = _model()
    model[2].weight.requires_grad_(False)
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", {"name": "sgd", "lr": 0.1}, tmp_path / "m.pt",
                                  example_inputs=(x, y))
    ref = Reference(path)  # the scripted model from the .pt
    ref.train_step(x, y)
    assert torch.equal(ref.parameters()["2.weight"], model[2].weight.detach())
    assert not torch.equal(ref.parameters()["4.weight"], model[4].weight.detach())


def test_java_protocol_names_the_same_fine_tuning_methods(jvm):
    import jpype

    Protocol = jpype.JClass("dev.gradbridge.Protocol")
    assert [str(m) for m in Protocol.OPTIONAL_METHODS] == list(protocol.OPTIONAL_METHODS)
    assert (str(Protocol.GET_LRS), str(Protocol.SET_GROUP_LR), str(Protocol.SCHEDULE_EPOCH)) == (
        protocol.GET_LRS, protocol.SET_GROUP_LR, protocol.SCHEDULE_EPOCH)


def test_one_group_in_its_own_order_keeps_that_order_for_the_optimizer_state(tmp_path):
    # torch numbers optimizer state in the group's order; the export and the reference follow it
    model = _model()
    x, y = labelled(96, **SCORES)
    optimizer = torch.optim.Adam(list(reversed(list(model.parameters()))), lr=0.01)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y))
    assert protocol.read_metadata(path)["optimizer"]["groups"][0]["params"][0] == "4.bias"
    scripted, ref = torch.jit.load(str(path)), Reference(path, model)
    with plain_graph_executor():
        scripted.train_step(x, y)
        ref.train_step(x, y)
    mine, theirs = scripted.optimizer_state(), ref.optimizer_state()
    assert [t.shape for t in mine["exp_avg"]] == [t.shape for t in theirs["exp_avg"]]
    assert all(torch.equal(a, b) for key in theirs for a, b in zip(mine[key], theirs[key]))


def test_lr_override_sets_every_group_and_is_recorded(tmp_path):
    # The seed's --lr: the exported optimizer at another rate, recorded as the module's lrs
    x, y = labelled(96, **SCORES)
    path = export_training_module(_model(), "cross_entropy", {"name": "sgd", "lr": 0.01}, tmp_path / "m.pt",
                                  example_inputs=(x, y))
    history = reference.train(path, x.numpy(), y.numpy(), epochs=1, mode="full", lr=0.05)
    assert history[0].lrs == [0.05] and history[0].loss > 0
