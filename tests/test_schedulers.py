"""Learning-rate schedules: the exported schedule's lr sequence equals torch.optim.lr_scheduler's
bit for bit over 1,200 steps (two parameter groups), and Java training with a schedule (per step,
per epoch, ReduceLROnPlateau on the validation or training loss) equals the eager reference."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as ls

from gradbridge import export_training_module, java, protocol, reference
from gradbridge.errors import GradbridgeError
from gradbridge.spec import schedulers

from .data import labelled

#: the data's settings: 4 classes ordered by a linear score of the features (tests/data.py)
SCORES = dict(tensors=True, labels="score", classes=4)

STEPS = 1200


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))


def _groups(scripted):
    """The loaded module's per-group optimizers (a loaded ModuleList is not iterable)."""
    return [module for _, module in scripted.optimizers.named_children()]


def _optimizer(model, cls=torch.optim.SGD):
    return cls([{"params": model[0].parameters(), "lr": 0.03}, {"params": model[2].parameters()}], lr=0.1)


SCHEDULES = {
    "step": lambda o: ls.StepLR(o, step_size=7, gamma=0.5),
    "multistep": lambda o: ls.MultiStepLR(o, milestones=[100, 300, 300, 700], gamma=0.3),
    "exponential": lambda o: ls.ExponentialLR(o, gamma=0.997),
    "cosine": lambda o: ls.CosineAnnealingLR(o, T_max=150, eta_min=1e-5),  # restarts: 1200 > 2 * T_max
    "linear": lambda o: ls.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=50),
    "onecycle": lambda o: ls.OneCycleLR(o, max_lr=[0.1, 0.01], total_steps=STEPS, cycle_momentum=False),
    "onecycle-momentum": lambda o: ls.OneCycleLR(o, max_lr=[0.1, 0.01], total_steps=STEPS, base_momentum=0.8),
    "onecycle-3-linear": lambda o: ls.OneCycleLR(o, max_lr=0.05, total_steps=STEPS, pct_start=0.25, three_phase=True,
                                                  anneal_strategy="linear", cycle_momentum=False),
    "warmup-cosine": lambda o: ls.SequentialLR(o, [ls.LinearLR(o, start_factor=0.01, total_iters=100),
                                                   ls.CosineAnnealingLR(o, T_max=STEPS - 100)], milestones=[100]),
    "warmup-step-exp": lambda o: ls.SequentialLR(o, [ls.LinearLR(o, 0.5, 1.0, 10),
                                                     ls.StepLR(o, 30, 0.9), ls.ExponentialLR(o, 0.999)],
                                                 milestones=[20, 500]),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_lr_sequence_equals_torch_over_1200_steps(tmp_path, name):
    # Given a fresh optimizer with two groups and a schedule over it, exported
    model = _model()
    optimizer = _optimizer(model)
    scheduler = SCHEDULES[name](optimizer)
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y),
                                  scheduler=scheduler)
    scripted = torch.jit.load(str(path))
    assert scripted.get_lrs() == [g["lr"] for g in optimizer.param_groups]
    # When both step 1,200 times (no gradients: only the schedule moves)
    for step in range(STEPS):
        scripted.optimizer_step()
        optimizer.step()
        scheduler.step()
        # Then every lr (and OneCycleLR's momentum) is the same double
        assert scripted.get_lrs() == [g["lr"] for g in optimizer.param_groups], step
        assert [m.momentum for m in _groups(scripted)] == [g["momentum"] for g in optimizer.param_groups], step


@pytest.mark.parametrize("cls, interval", [(torch.optim.Adam, "step"), (torch.optim.AdamW, "step"),
                                           (torch.optim.AdamW, "epoch"), (torch.optim.SGD, "epoch")])
def test_one_cycle_cycles_beta1_or_momentum_from_java(jvm, tmp_path, cls, interval):
    model = _model()
    optimizer = cls(model.parameters(), lr=0.01, **({"momentum": 0.9} if cls is torch.optim.SGD else {}))
    scheduler = ls.OneCycleLR(optimizer, max_lr=0.05, total_steps=6 * 6 if interval == "step" else 6, pct_start=0.4)
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y),
                                  scheduler=scheduler, scheduler_interval=interval)
    scripted = torch.jit.load(str(path))
    key = "momentum" if cls is torch.optim.SGD else "beta1"
    assert [getattr(m, key) for m in _groups(scripted)] == [0.95]
    history = _train_both(path, model, x, y)
    assert history[-1].lrs != history[0].lrs


def test_plateau_lr_sequence_equals_torch_over_1200_epochs(tmp_path):
    model = _model()
    optimizer = _optimizer(model)
    scheduler = ls.ReduceLROnPlateau(optimizer, factor=0.7, patience=3, cooldown=2, threshold=1e-3, min_lr=[1e-4, 1e-3])
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y),
                                  scheduler=scheduler)
    assert protocol.read_metadata(path)["fine_tuning"]["scheduler_interval"] == "epoch"
    scripted = torch.jit.load(str(path))
    rng = random.Random(0)
    metric = 1.0
    for epoch in range(STEPS):
        metric = metric * rng.uniform(0.97, 1.02)  # improves, stalls, worsens
        scripted.schedule_epoch(metric)
        scheduler.step(metric)
        assert scripted.get_lrs() == [g["lr"] for g in optimizer.param_groups], epoch
    assert scripted.get_lrs() != [0.03, 0.1]  # it did reduce


def _train_both(path, model, x, y, val=None, **settings):
    settings = {"epochs": 6, "batch_size": 16, "seed": 5, "mode": "step", **settings}
    val_np = None if val is None else (val[0].numpy(), val[1].numpy())
    in_java = java.train(path, x.numpy(), y.numpy(), val=val_np, **settings)
    in_python = reference.train(path, x.numpy(), y.numpy(), model=model, val=val_np, **settings)
    assert len(in_java) == len(in_python) == settings["epochs"]
    for a, b in zip(in_java, in_python):
        assert (a.loss, a.val_loss, a.digests, a.lrs) == (b.loss, b.val_loss, b.digests, b.lrs), a.epoch
    return in_java


@pytest.mark.parametrize("mode", ["step", "fused"])
def test_warmup_cosine_per_step_from_java(jvm, tmp_path, mode):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = ls.SequentialLR(optimizer, [ls.LinearLR(optimizer, 0.1, total_iters=8),
                                            ls.CosineAnnealingLR(optimizer, T_max=28)], milestones=[8])
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y),
                                  scheduler=scheduler)
    history = _train_both(path, model, x, y, mode=mode)
    assert len({tuple(r.lrs) for r in history}) == len(history)  # the lr moved every epoch


def test_step_schedule_per_epoch_from_java(jvm, tmp_path):
    model = _model()
    optimizer = _optimizer(model, torch.optim.Adam)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt",
                                  example_inputs=labelled(96, **SCORES),
                                  scheduler=ls.StepLR(optimizer, 2, 0.5), scheduler_interval="epoch")
    history = _train_both(path, model, *labelled(96, **SCORES))
    assert [r.lrs for r in history][:3] == [[0.03, 0.1], [0.015, 0.05], [0.015, 0.05]]


@pytest.mark.parametrize("with_validation", [True, False], ids=["val-loss", "train-loss"])
def test_plateau_from_java_on_the_validation_or_training_loss(jvm, tmp_path, with_validation):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    scheduler = ls.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.05)
    x, y = labelled(96, **SCORES)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y),
                                  scheduler=scheduler)
    val = labelled(48, seed=1, **SCORES) if with_validation else None
    history = _train_both(path, model, x, y, val=val, epochs=8)
    assert history[-1].lrs[0] < 0.5  # the plateau was reached and the lr cut


def test_unsupported_scheduler_is_refused_naming_the_supported_ones(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(GradbridgeError) as error:
        export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt",
                               example_inputs=labelled(96, **SCORES),
                               scheduler=ls.LambdaLR(optimizer, lambda epoch: 0.9 ** epoch))
    assert str(error.value) == schedulers.unsupported_message("LambdaLR")
    assert "StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, OneCycleLR, SequentialLR, " \
           "ReduceLROnPlateau" in str(error.value)
    assert not (tmp_path / "m.pt").exists()
