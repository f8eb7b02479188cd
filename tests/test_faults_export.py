"""Fault suite, export: real optimizer instances export unless they have really stepped, and a
built-in exported with input shapes it cannot take is refused before anything is written.
"""

from __future__ import annotations

import pytest
import torch

from gradbridge import GradbridgeError, export_training_module, messages, protocol, reference
from gradbridge.models import mlp

INPUTS = [protocol.tensor_spec("x", [-1, 4], "float32"), protocol.tensor_spec("y", [-1], "int64")]


def _model():
    torch.manual_seed(0)
    return mlp(4, (8,), 3)


def test_fresh_adagrad_instance_exports_and_trains_like_torch(tmp_path):
    model = _model()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05, initial_accumulator_value=0.1)
    assert optimizer.state, "Adagrad creates its state when constructed"
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "adagrad.pt", inputs=INPUTS)
    spec = protocol.read_metadata(path)["optimizer"]
    assert spec["name"] == "adagrad" and spec["lr"] == 0.05 and spec["initial_accumulator_value"] == 0.1

    module = torch.jit.load(str(path))
    eager = reference.Reference(path, model)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    with torch.jit.optimized_execution(False):
        for _ in range(5):
            assert torch.equal(module.train_step(x, y), eager.train_step(x, y))
        assert all(torch.equal(a, b) for a, b in zip(module.get_parameters(), eager.parameters().values()))


@pytest.mark.parametrize("make", [
    lambda params: torch.optim.Adagrad(params),
    lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    lambda params: torch.optim.Adam(params),
])
def test_stepped_optimizer_is_refused(tmp_path, make):
    model = _model()
    optimizer = make(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    with pytest.raises(GradbridgeError, match=r"has already stepped; export a fresh optimizer"):
        export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", inputs=INPUTS)
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize("fmt", ["auto", "torchscript", "export"])
def test_a_model_or_batch_on_another_device_than_cpu_or_cuda_is_refused_in_one_line(tmp_path, fmt):
    # An export writes CPU tensors from a model on the CPU or a CUDA device (tests/test_cuda.py: a CUDA model
    # exports from a CPU copy); the meta device holds no values: refused in one line, as any other would be.
    model = _model()
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])
    with pytest.raises(GradbridgeError) as refused:
        export_training_module(_model().to("meta"), "cross_entropy", "sgd", tmp_path / "m.pt", example_inputs=(x, y),
                               format=fmt)
    assert str(refused.value) == messages.unsupported_device("parameter 0.weight", "meta")
    with pytest.raises(GradbridgeError, match=r"^example_inputs\[1\] is on meta; gradbridge takes models and tensors "
                                              r"on the CPU or a CUDA device"):
        export_training_module(model, "cross_entropy", "sgd", tmp_path / "m.pt", example_inputs=(x, y.to("meta")),
                               format=fmt)
    assert not (tmp_path / "m.pt").exists()
    path = export_training_module(model, "cross_entropy", "sgd", tmp_path / "m.pt", example_inputs=(x, y), format=fmt)
    with pytest.raises(GradbridgeError, match=r"^parameter 0.weight is on meta; "):
        reference.train(path, x.numpy(), y.numpy(), epochs=1, batch_size=4, model=_model().to("meta"))


def test_builtin_with_an_impossible_input_shape_is_refused_at_export(tmp_path):
    from gradbridge import export_builtin

    with pytest.raises(ValueError, match=r"^inputs x \[-1, 5\] float32, y \[-1\] int64 do not fit model mlp with "
                                         r"loss cross_entropy: .*5.*4"):
        export_builtin("mlp", tmp_path / "m.pt", in_features=4, hidden=(8,), out_features=3, loss={"name": "cross_entropy"},
                       inputs=[protocol.tensor_spec("x", [-1, 5], "float32"), protocol.tensor_spec("y", [-1], "int64")])
    assert list(tmp_path.iterdir()) == []


def test_export_cli_with_an_impossible_input_shape(tmp_path):
    from tests.faults import gradbridge_cli, one_error_line

    result = gradbridge_cli("export", "mlp", "-o", tmp_path / "m.pt", "--input-shape", "3,3", "--loss", "cross_entropy")
    line = one_error_line(result, "gradbridge: error: ")
    assert line == "model mlp takes --input-shape FEATURES (one number), got 3,3"
    assert list(tmp_path.iterdir()) == []


def test_files_follow_the_umask_and_keep_existing_permissions(tmp_path):
    import os
    import stat

    from gradbridge import History, export_builtin
    from gradbridge.history import EpochRecord

    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    previous = os.umask(0o027)
    try:
        model = export_builtin("linear-regression", tmp_path / "lr.pt")
        history = History([EpochRecord(0, 1.0, {})]).save(tmp_path / "h.jsonl")
        assert (mode(model), mode(history)) == (0o640, 0o640)
        os.chmod(history, 0o644)
        os.umask(0o077)
        History([EpochRecord(0, 2.0, {})]).save(history)
        assert mode(history) == 0o644
    finally:
        os.umask(previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl", "lr.pt"]


# ---- exact or refused: tensor hyper-parameters, look-alike schedulers, mistyped options ----

from torch.optim import lr_scheduler as ls  # noqa: E402

from gradbridge.spec import schedulers  # noqa: E402

TENSOR_SCHEDULES = {
    "StepLR": lambda o: ls.StepLR(o, step_size=2, gamma=0.1),
    "MultiStepLR": lambda o: ls.MultiStepLR(o, milestones=[2, 3], gamma=0.3),
    "ExponentialLR": lambda o: ls.ExponentialLR(o, gamma=0.9),
    "CosineAnnealingLR": lambda o: ls.CosineAnnealingLR(o, T_max=5, eta_min=0.01),
    "SequentialLR": lambda o: ls.SequentialLR(o, [ls.LinearLR(o, 0.1, total_iters=2), ls.ExponentialLR(o, 0.9)],
                                              milestones=[2]),
    "OneCycleLR": lambda o: ls.OneCycleLR(o, max_lr=0.5, total_steps=10),
}


def _lrs(optimizer, scheduler, steps=6):
    out = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        out.append(float(optimizer.param_groups[0]["lr"]))
    return out


@pytest.mark.parametrize("name", TENSOR_SCHEDULES)
def test_a_tensor_learning_rate_is_refused_where_torch_rounds_it(tmp_path, name):
    # Why it is refused: eager torch keeps a tensor lr in float32, so its schedule differs from the
    # float lr's (the only arithmetic the export holds) within a few steps.
    make = TENSOR_SCHEDULES[name]
    with_tensor = torch.optim.SGD(_model().parameters(), lr=torch.tensor(0.5), momentum=0.9)
    with_float = torch.optim.SGD(_model().parameters(), lr=0.5, momentum=0.9)
    assert _lrs(with_tensor, make(with_tensor)) != _lrs(with_float, make(with_float))

    model = _model()
    optimizer = torch.optim.SGD([{"params": model.parameters(), "lr": torch.tensor(0.5)}], momentum=0.9)
    with pytest.raises(GradbridgeError) as error:
        export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", inputs=INPUTS,
                               scheduler=make(optimizer))
    assert str(error.value) == ("SGD: lr is a tensor, which torch computes with in float32 (rounding every value "
                                "it takes, scheduled ones too); gradbridge exports Python numbers: pass lr as a float")
    assert list(tmp_path.iterdir()) == []


def test_a_tensor_hyper_parameter_is_refused_without_a_scheduler_too(tmp_path):
    model = _model()
    groups = [{"params": [model[0].weight, model[0].bias]}, {"params": model[2].parameters(), "lr": torch.tensor(0.1)}]
    with pytest.raises(GradbridgeError, match=r"^Adam parameter group 1: lr is a tensor, which torch computes with in float32"):
        export_training_module(model, "cross_entropy", torch.optim.Adam(groups, lr=0.01), tmp_path / "m.pt",
                               inputs=INPUTS)
    with pytest.raises(ValueError, match=r"^optimizer adam: lr is a tensor, which torch computes with in float32"):
        export_training_module(_model(), "cross_entropy", {"name": "adam", "lr": torch.tensor(0.5)},
                               tmp_path / "m.pt", inputs=INPUTS)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options, key", [({"max_lr": torch.tensor(0.5)}, "max_lr"),
                                          ({"max_lr": 0.5, "max_momentum": torch.tensor(0.9)}, "max_momentum"),
                                          ({"max_lr": 0.5, "base_momentum": torch.tensor(0.8)}, "base_momentum")])
def test_one_cycle_with_a_tensor_option_is_one_line_naming_it(tmp_path, options, key):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = ls.OneCycleLR(optimizer, total_steps=10, **options)
    with pytest.raises(GradbridgeError) as error:
        export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", inputs=INPUTS,
                               scheduler=scheduler)
    assert str(error.value).startswith(f"OneCycleLR parameter group 0: {key} is a tensor, which")
    assert "\n" not in str(error.value) and list(tmp_path.iterdir()) == []


def test_one_cycle_per_epoch_cycles_momentum_and_beta1_as_eager_does(tmp_path):
    for cls, key in ((torch.optim.SGD, "momentum"), (torch.optim.Adam, "betas"), (torch.optim.AdamW, "betas")):
        model = _model()
        optimizer = cls(model.parameters(), lr=0.1, **({"momentum": 0.9} if key == "momentum" else {}))
        scheduler = ls.OneCycleLR(optimizer, max_lr=0.5, total_steps=12, base_momentum=0.8, max_momentum=0.95)
        path = export_training_module(model, "cross_entropy", optimizer, tmp_path / f"{cls.__name__}.pt",
                                      inputs=INPUTS, scheduler=scheduler, scheduler_interval="epoch")
        scripted = torch.jit.load(str(path))
        opt = next(module for _, module in scripted.optimizers.named_children())
        for epoch in range(12):
            scripted.schedule_epoch(1.0)
            optimizer.step()
            scheduler.step()
            group = optimizer.param_groups[0]
            expected = group["momentum"] if key == "momentum" else group["betas"][0]
            assert (scripted.get_lrs()[0], opt.momentum if key == "momentum" else opt.beta1) == \
                (group["lr"], expected), (cls.__name__, epoch)


def test_a_look_alike_scheduler_class_is_refused_as_not_torchs(tmp_path):
    class StepLR(ls.LRScheduler):  # the user's own, named like torch's
        def get_lr(self):
            return [g["lr"] * 0.5 for g in self.optimizer.param_groups]

    class MyCosine(ls.CosineAnnealingLR):
        pass

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(GradbridgeError) as error:
        export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", inputs=INPUTS,
                               scheduler=StepLR(optimizer))
    assert str(error.value) == (f"cannot export scheduler {__name__}.test_a_look_alike_scheduler_class_is_refused_as_"
                                "not_torchs.<locals>.StepLR: it is not torch.optim.lr_scheduler.StepLR (a subclass "
                                "or another class of that name may compute other lrs); use torch's StepLR")
    # inside a SequentialLR as well
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sequential = ls.SequentialLR(optimizer, [ls.LinearLR(optimizer, 0.5, total_iters=2), MyCosine(optimizer, 5)],
                                 milestones=[2])
    with pytest.raises(GradbridgeError, match=r"^cannot export scheduler MyCosine; supported: StepLR"):
        export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", inputs=INPUTS,
                               scheduler=sequential)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make, message", [
    (lambda o: ls.CosineAnnealingLR(o, T_max=10.5), "scheduler cosine: T_max must be an integer, got 10.5"),
    (lambda o: ls.StepLR(o, step_size=2.0), "scheduler step: step_size must be an integer, got 2.0"),
    (lambda o: ls.MultiStepLR(o, milestones=[2.5]), "scheduler multistep: milestones must be a list of integers, "
                                                     "got [2.5]"),
])
def test_a_float_where_the_export_holds_an_integer_is_refused(tmp_path, make, message):
    # torch computes with the float; the scripted schedule holds an int: refused, not truncated
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError) as error:
        export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", inputs=INPUTS,
                               scheduler=make(optimizer))
    assert str(error.value) == message


@pytest.mark.parametrize("spec, message", [
    ({"name": "cosine"}, "scheduler cosine: T_max is required (e.g. cosine:T_max=...)"),
    ({"name": "onecycle", "max_lr": 0.1}, "scheduler onecycle: total_steps is required (e.g. onecycle:total_steps=...)"),
    ({"name": "cosine", "T_max": "abc"}, "scheduler cosine: T_max must be an integer, got 'abc'"),
    ({"name": "step", "step_size": 3, "gama": 0.5}, "scheduler step: unknown option 'gama'; options: step_size, gamma"),
    ({"name": "onecycle", "max_lr": "abc", "total_steps": 5},
     "scheduler onecycle: max_lr must be a number or one per parameter group (1), got 'abc'"),
])
def test_bad_scheduler_specs_are_one_line_naming_the_option(tmp_path, spec, message):
    with pytest.raises(ValueError) as error:
        export_training_module(_model(), "cross_entropy", {"name": "sgd", "lr": 0.1}, tmp_path / "m.pt",
                               inputs=INPUTS, scheduler=spec)
    assert str(error.value) == message


@pytest.mark.parametrize("spec, message", [
    ({"name": "sgd", "lr": "abc"}, "optimizer sgd: lr must be a number, got 'abc'"),
    ({"name": "sgd", "nesterov": 1}, "optimizer sgd: nesterov must be true or false, got 1"),
    ({"name": "adam", "betas": [0.9]}, "optimizer adam: betas must be 2 numbers, got [0.9]"),
    ({"name": "sgd", "lr": 0.1, "foo": 1}, "optimizer sgd: unknown option 'foo'; options: lr, momentum, dampening, "
                                           "weight_decay, nesterov, maximize"),
    ({"name": "sgd", "lr": 0.1, "groups": [{"prefix": "0.", "lr": "abc"}]},
     "parameter group 0 (prefix '0.'): lr must be a number, got 'abc'"),
    ({"name": "sgd", "lr": 0.1, "groups": [{"prefix": "0", "lr": 0.2}, {"prefix": "0.", "lr": 0.3}]},
     "parameter groups 0 (prefix '0') and 1 (prefix '0.') overlap: 0.weight is in both; give each parameter one group"),
])
def test_bad_optimizer_options_are_one_line_naming_the_option(tmp_path, spec, message):
    with pytest.raises(ValueError) as error:
        export_training_module(_model(), "cross_entropy", spec, tmp_path / "m.pt", inputs=INPUTS)
    assert str(error.value) == message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make, message", [
    (lambda p: torch.optim.Adam(p, foreach=True), "Adam: foreach=True is not exported: gradbridge reproduces "
                                                  "torch.optim's single-tensor path (the CPU default); leave foreach unset"),
    (lambda p: torch.optim.Adam(p, fused=True), "Adam: fused=True is not exported"),
    (lambda p: torch.optim.SGD(p, lr=0.1, differentiable=True), "SGD: differentiable=True is not exported"),
    (lambda p: torch.optim.RMSprop(p, capturable=True), "RMSprop: capturable=True is not exported"),
    (lambda p: torch.optim.Adam(p, weight_decay=0.1, decoupled_weight_decay=True),
     "Adam: decoupled_weight_decay=True is not exported: use torch.optim.AdamW"),
    (lambda p: torch.optim.Adam([{"params": list(p)[:2]}, {"params": list(p)[2:], "foreach": True}]),
     "Adam parameter group 1: foreach=True is not exported"),
])
def test_torch_optim_settings_that_pick_other_arithmetic_are_refused(tmp_path, make, message):
    model = _model()
    with pytest.raises(GradbridgeError) as error:
        export_training_module(model, "cross_entropy", make(model.parameters()), tmp_path / "m.pt", inputs=INPUTS)
    assert str(error.value).startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_a_scheduler_over_another_optimizer_is_refused(tmp_path):
    # eager training would step an lr that the exported optimizer never reads
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(GradbridgeError, match=r"^scheduler StepLR schedules another optimizer than the one exported"):
        export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", inputs=INPUTS,
                               scheduler=ls.StepLR(other, 2))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("loss, message", [
    ({"name": "cross_entropy", "label_smoothing": "abc"}, "loss cross_entropy: label_smoothing must be a number, got 'abc'"),
    ({"name": "cross_entropy", "foo": 1}, "loss cross_entropy: unknown option 'foo'; options: reduction, weight, "
                                          "ignore_index, label_smoothing"),
    (torch.nn.CrossEntropyLoss(ignore_index=1.5), "loss cross_entropy: ignore_index must be an integer, got 1.5"),
    (torch.nn.CrossEntropyLoss(weight=torch.ones(3, dtype=torch.float64)),
     "CrossEntropyLoss: weight is float64; gradbridge holds loss weights in float32: pass a float32 tensor"),
    ({"name": "cross_entropy", "label_smoothing": torch.tensor(0.1)},
     "loss cross_entropy: label_smoothing is a tensor, which torch computes with in float32"),
])
def test_bad_loss_options_are_one_line_naming_the_option(tmp_path, loss, message):
    with pytest.raises(ValueError) as error:
        export_training_module(_model(), loss, {"name": "sgd", "lr": 0.1}, tmp_path / "m.pt", inputs=INPUTS)
    assert str(error.value).startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_micro_batches_of_one_are_refused_in_one_line_where_the_model_cannot_run_one(tmp_path):
    """BatchNorm in training refuses one sample (eager too): no train_accumulate@1, so accumulate=5 over an
    example batch of 8 (a batch of 9 splits into [2, 2, 2, 2, 1]) is refused before anything is written."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    with pytest.raises(GradbridgeError) as info:
        export_training_module(model, "cross_entropy", "sgd", tmp_path / "m.pt", example_inputs=(x, y),
                               format="export", accumulate=5)
    assert str(info.value) == messages.aten_micro_batches_too_small(9, 5, [2, 2, 2, 2, 1], 2)
    assert not (tmp_path / "m.pt").exists()


def test_a_bare_assertion_in_torch_export_names_where_it_failed():
    """torch.export's internals fail some models with a bare `assert` (no text): the refusal line then
    says where, not only "AssertionError"."""
    from gradbridge.export import traceable

    def create_graph_signature():
        raise AssertionError()  # what a bare `assert` raises (pytest rewrites this file's asserts)

    try:
        create_graph_signature()
    except AssertionError as ex:
        reason = traceable.capture_failure(ex)
    line = create_graph_signature.__code__.co_firstlineno + 1
    assert reason.startswith(f"AssertionError in {__file__}:{line} (create_graph_signature)"), reason


def test_a_bare_cpp_lookup_failure_while_tracing_is_said_in_words(tmp_path, monkeypatch):
    """torch.jit.trace of an HF decoder on transformers 4.57 fails with libtorch's bare
    std::out_of_range text (``_Map_base::at``): the one line says what failed instead."""
    from gradbridge._runtime import torchscript

    class Unscriptable(torch.nn.Module):  # **kwargs: TorchScript cannot script it, so it is traced
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x, **kwargs):
            return self.linear(x)

    def failing_trace(*args, **kwargs):
        raise IndexError("_Map_base::at")  # pybind11's translation of std::out_of_range

    monkeypatch.setattr(torchscript, "trace", failing_trace)
    target = tmp_path / "m.pt"
    with pytest.raises(GradbridgeError) as raised:
        export_training_module(Unscriptable(), "cross_entropy", "sgd", target, format="torchscript",
                               example_inputs=(torch.randn(2, 4), torch.tensor([0, 1])))
    text = str(raised.value)
    assert "tracing: torch.jit.trace failed inside libtorch (an internal lookup failed: _Map_base::at)" in text
    assert "\n" not in text and not target.exists()
    assert messages.libtorch_internal("torch.jit.trace", "shape mismatch") == "shape mismatch"
