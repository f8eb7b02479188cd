"""Exported optimizers against eager torch.optim, bit for bit.

For every optimizer configuration x {3-layer MLP, small CNN with BatchNorm, MLP with dropout}:
50 train_step calls on the scripted module driven from Python equal 50 eager torch.optim steps
exactly: losses, parameters, buffers and optimizer state after every step. The state holds
torch.optim's keys and no others, so a saved module is no bigger than that state asks.
"""

from __future__ import annotations


import pytest
import torch

from gradbridge import export_training_module, verify
from gradbridge.spec import optim
from gradbridge.models import SmallCNN, mlp
from gradbridge.reference import Reference
from gradbridge._runtime.torchscript import plain_graph_executor
from tests.matrix import OPTIMIZER_VARIANTS as OPTIMIZERS

pytestmark = pytest.mark.every_torch  # Python-side parity: `make test` runs it on the newest torch too

STEPS = 50
BATCH = verify.OPTIMIZER_BATCH
MODELS = verify.OPTIMIZER_MODELS
_data = verify.classification_data


def _assert_same(expected: dict, actual: dict, what: str, step: int):
    assert expected.keys() == actual.keys(), what
    for name in expected:
        assert torch.equal(expected[name], actual[name]), (
            f"step {step}: {what} {name} differs by {(expected[name] - actual[name]).abs().max().item():.3e}")


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=str)
@pytest.mark.parametrize("model_name", MODELS, ids=str)
def test_exported_optimizer_equals_torch_optim(tmp_path, optimizer, model_name):
    """Given the eager model, torch.optim and the exported module from the same initial tensors, STEPS
    steps of each agree exactly, state keys included (`gradbridge verify` runs the same comparison)."""
    factory, shape = MODELS[model_name]
    torch.manual_seed(0)
    model = factory()
    x, y = _data(shape)
    path = export_training_module(model, "cross_entropy", OPTIMIZERS[optimizer], tmp_path / "m.pt",
                                  example_inputs=(x[:BATCH], y[:BATCH]))
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]
    assert verify.optimizer_difference(path, model, batches, STEPS) is None
    if model_name == "cnn-batchnorm":
        assert any("running_mean" in n for n in torch.jit.load(str(path)).buffer_names())


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


# Every optimizer's configurations that change which keys torch.optim's state holds.
STATE_VARIANTS = {
    **OPTIMIZERS,
    "sgd-momentum": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
    "adam-amsgrad": {"name": "adam", "lr": 1e-2, "amsgrad": True},
    "adamw-amsgrad": {"name": "adamw", "lr": 1e-2, "amsgrad": True},
    "rmsprop": {"name": "rmsprop", "lr": 1e-3},
    "rmsprop-momentum": {"name": "rmsprop", "lr": 1e-3, "momentum": 0.5},
    "rmsprop-centered": {"name": "rmsprop", "lr": 1e-3, "centered": True},
}


def _torch_state(optimizer: torch.optim.Optimizer) -> dict:
    """torch.optim's state as ``{key: [tensor of each parameter that holds the key]}`` in state_dict order."""
    state: dict = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state[p].items():
                state.setdefault(key, []).append(value)
    return state


def _assert_state_is_torchs(expected: dict, actual: dict):
    assert sorted(actual) == sorted(expected)
    for key, values in expected.items():
        assert len(actual[key]) == len(values), key
        for i, (e, a) in enumerate(zip(values, actual[key])):
            assert a.dtype == e.dtype and torch.equal(a, e), f"{key}[{i}]"


@pytest.mark.parametrize("optimizer", STATE_VARIANTS, ids=str)
def test_state_holds_torch_optims_keys_and_tensors_after_one_step(tmp_path, optimizer):
    torch.manual_seed(0)
    model = mlp(in_features=6, hidden=(16,), out_features=3)
    x, y = _data((6,))
    path = export_training_module(model, "cross_entropy", STATE_VARIANTS[optimizer], tmp_path / "m.pt",
                                  example_inputs=(x, y))
    reference, scripted = Reference(path, model), torch.jit.load(str(path))
    with plain_graph_executor():
        assert torch.equal(scripted.train_step(x, y), reference.train_step(x, y))
    _assert_state_is_torchs(_torch_state(reference.optimizer), scripted.optimizer_state())


@pytest.mark.parametrize("cls, first, second", [(torch.optim.SGD, {"momentum": 0.9, "dampening": 0.1}, {}),
                                                (torch.optim.Adam, {}, {"amsgrad": True}),
                                                (torch.optim.RMSprop, {"centered": True}, {"momentum": 0.5})],
                         ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_each_group_holds_the_keys_its_options_call_for(tmp_path, cls, first, second):
    # Given two groups, of which one holds a key the other does not (torch.optim's state follows the group)
    torch.manual_seed(0)
    model = mlp(in_features=6, hidden=(16,), out_features=3)
    x, y = _data((6,))
    optimizer = cls([{"params": model[0].parameters(), **first}, {"params": model[2].parameters(), **second}],
                    lr=0.01)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y))
    reference, scripted, resumed = Reference(path, model), torch.jit.load(str(path)), torch.jit.load(str(path))
    # When both step, and a copy resumes from the exported state
    with plain_graph_executor():
        for _ in range(3):
            assert torch.equal(scripted.train_step(x, y), reference.train_step(x, y))
        resumed.set_parameters(scripted.get_parameters())
        resumed.load_optimizer_state(scripted.optimizer_state())
        for _ in range(3):
            loss = reference.train_step(x, y)
            assert torch.equal(scripted.train_step(x, y), loss) and torch.equal(resumed.train_step(x, y), loss)
    # Then each holds torch.optim's state, key by key, in group order
    _assert_state_is_torchs(_torch_state(reference.optimizer), scripted.optimizer_state())
    _assert_state_is_torchs(_torch_state(reference.optimizer), resumed.optimizer_state())


def test_a_state_with_a_key_the_optimizer_does_not_hold_is_refused(tmp_path):
    x, y = _data((6,))
    path = export_training_module(mlp(6, (8,), 3), "cross_entropy", {"name": "adam", "lr": 0.01}, tmp_path / "m.pt",
                                  example_inputs=(x, y))
    scripted = torch.jit.load(str(path))
    state = scripted.optimizer_state()
    state["max_exp_avg_sq"] = state["exp_avg_sq"]  # AMSGrad's buffer, which amsgrad=False has not
    with pytest.raises(torch.jit.Error, match="load_optimizer_state: unexpected key max_exp_avg_sq"):
        scripted.load_optimizer_state(state)


@pytest.mark.parametrize("name", ["sgd", "rmsprop"])
def test_momentum_a_schedule_sets_gets_its_buffer_at_the_first_step(tmp_path, name):
    # Given no momentum in the spec, and OneCycleLR, which cycles it (torch sets 0.95 when it is made)
    torch.manual_seed(0)
    model = mlp(in_features=6, hidden=(16,), out_features=3)
    x, y = _data((6,))
    path = export_training_module(model, "cross_entropy", {"name": name, "lr": 0.01}, tmp_path / "m.pt",
                                  example_inputs=(x, y), scheduler={"name": "onecycle", "max_lr": 0.1, "total_steps": 10})
    reference, scripted, fresh = Reference(path, model), torch.jit.load(str(path)), torch.jit.load(str(path))
    assert "momentum_buffer" not in scripted.optimizer_state()
    # When both step, the buffer is created as torch.optim creates it
    with plain_graph_executor():
        for _ in range(5):
            assert torch.equal(scripted.train_step(x, y), reference.train_step(x, y))
    state = scripted.optimizer_state()
    _assert_state_is_torchs(_torch_state(reference.optimizer), state)
    # and a copy that never stepped takes that state in, buffer included
    fresh.load_optimizer_state(state)
    _assert_state_is_torchs(state, fresh.optimizer_state())


class _Gated(torch.nn.Module):
    """``b`` takes part only in batches with a large first feature: until then it has no gradient, and
    torch.optim.SGD no momentum_buffer for it."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 3)
        self.b = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.a(x)
        if bool((x[:, 0] > 10.0).any()):
            out = out + self.b(x)
        return out


def test_a_parameter_without_a_momentum_buffer_in_torchs_state_stays_without_one(tmp_path):
    # Given SGD with dampening, and a state saved after a step in which b had no gradient
    torch.manual_seed(0)
    model = _Gated()
    x, y = _data((6,))
    wide = x.clone()
    wide[0, 0] = 20.0
    path = export_training_module(model, "cross_entropy",
                                  torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, dampening=0.5),
                                  tmp_path / "m.pt", example_inputs=(x, y))
    reference, scripted, resumed = Reference(path, model), torch.jit.load(str(path)), torch.jit.load(str(path))
    with plain_graph_executor():
        assert torch.equal(scripted.train_step(x, y), reference.train_step(x, y))
        held = [reference.optimizer.state[p] for p in reference.optimizer.param_groups[0]["params"]]
        assert ["momentum_buffer" in state for state in held] == [True, True, False, False]
        # torch's state in the export's layout: an empty tensor where torch holds no buffer, as optimizer_state says
        state = {"momentum_buffer": [s.get("momentum_buffer", torch.empty(0)) for s in held]}
        _assert_state_is_torchs(state, scripted.optimizer_state())
        # When a copy resumes from it, b's first step copies its gradient into a new buffer (no dampening)
        resumed.set_parameters(scripted.get_parameters())
        resumed.load_optimizer_state(state)
        for batch in (wide, wide, x):
            loss = reference.train_step(batch, y)
            assert torch.equal(resumed.train_step(batch, y), loss)
    # Then it holds torch.optim's parameters and state, bit for bit
    _assert_same(reference.parameters(), dict(zip(resumed.parameter_names(), resumed.get_parameters())), "parameter", 3)
    _assert_state_is_torchs(_torch_state(reference.optimizer), resumed.optimizer_state())


@pytest.mark.parametrize("scheduler", [None, {"name": "onecycle", "max_lr": 0.1, "total_steps": 10}],
                         ids=["momentum", "onecycle-momentum"])
def test_a_state_saved_before_any_step_holds_no_buffer_and_loads_as_torch_loads_it(tmp_path, scheduler):
    # Given SGD with momentum (dampened), or none with OneCycleLR cycling one in, and no step taken
    torch.manual_seed(0)
    model = mlp(in_features=6, hidden=(16,), out_features=3)
    x, y = _data((6,))
    spec = {"name": "sgd", "lr": 0.01, **({} if scheduler else {"momentum": 0.9, "dampening": 0.5})}
    path = export_training_module(model, "cross_entropy", spec, tmp_path / "m.pt", example_inputs=(x, y),
                                  **({"scheduler": scheduler} if scheduler else {}))
    reference, scripted, fresh = Reference(path, model), torch.jit.load(str(path)), torch.jit.load(str(path))
    # torch's state dict holds no momentum_buffer yet, nor does the export's
    assert _torch_state(reference.optimizer) == {} and scripted.optimizer_state() == {}
    # When a fresh copy loads that state (torch.optim loads it too: its first step makes the buffers)
    reference.optimizer.load_state_dict(reference.optimizer.state_dict())
    fresh.load_optimizer_state(scripted.optimizer_state())
    with plain_graph_executor():
        for _ in range(5):
            assert torch.equal(fresh.train_step(x, y), reference.train_step(x, y))
    # Then it trains as torch.optim does, buffers created at the first step
    _assert_state_is_torchs(_torch_state(reference.optimizer), fresh.optimizer_state())


@pytest.mark.parametrize("spec", [{"name": "adam", "lr": 1e-3}, {"name": "adam", "lr": 1e-3, "amsgrad": True},
                                  {"name": "sgd", "lr": 0.1}, {"name": "sgd", "lr": 0.1, "momentum": 0.9},
                                  {"name": "rmsprop", "lr": 0.01}], ids=str)
def test_saved_module_is_parameters_and_torchs_state(tmp_path, spec):
    torch.manual_seed(0)
    model = mlp(in_features=32, hidden=(256, 256), out_features=10)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    path = export_training_module(model, "cross_entropy", spec, tmp_path / "m.pt", example_inputs=(x, y))
    reference = Reference(path, model)
    with plain_graph_executor():
        reference.train_step(x, y)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for values in _torch_state(reference.optimizer).values()
                      for t in values)
    # parameters, torch.optim's state after a step, and code + metadata (about 50 KB, under half the
    # parameter bytes here); no gradient buffers (allocated at a parameter's first gradient)
    limit = parameter_bytes + state_bytes + parameter_bytes // 2
    assert path.stat().st_size < limit, f"{path.stat().st_size} bytes, {path.stat().st_size / parameter_bytes:.2f}x"


@pytest.mark.parametrize("spec", [{"name": "adam", "lr": 1e-2, "amsgrad": True},
                                  OPTIMIZERS["sgd-momentum-dampening"], OPTIMIZERS["rmsprop-centered-momentum"]],
                         ids=lambda spec: spec["name"])
def test_optimizer_state_round_trip_equals_uninterrupted_training(tmp_path, spec):
    torch.manual_seed(0)
    model = mlp(in_features=6, hidden=(16, 16), out_features=3, dropout=0.2)
    x, y = _data((6,))
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
