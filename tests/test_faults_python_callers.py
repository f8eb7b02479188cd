"""Fault suite, in-process API for Python callers of an exported module: the supported way
(gradbridge.load_for_python) steps bit for bit like eager torch.optim.

A module loaded with plain torch.jit.load and driven with train_step runs under TorchScript's
optimizing graph executor and drifts (1e-8 to 3e-5 within 25 steps for Adam and RMSprop).
"""

from __future__ import annotations

import pytest
import torch

from gradbridge import export_training_module, protocol, reference
from gradbridge.models import mlp
from gradbridge._runtime.torchscript import load_for_python

STEPS = 25


@pytest.mark.parametrize("optimizer", [{"name": "adam", "lr": 0.01}, {"name": "rmsprop", "lr": 0.01}])
def test_load_for_python_steps_like_torch_optim(tmp_path, optimizer):
    # The setting is thread-local, and in-process Java turns it off on this thread: start from
    # torch's default (on) to see that load_for_python gives it back.
    previous = torch._C._get_graph_executor_optimize()
    torch._C._set_graph_executor_optimize(True)
    try:
        _steps_like_torch_optim(tmp_path, optimizer)
    finally:
        torch._C._set_graph_executor_optimize(previous)


def _steps_like_torch_optim(tmp_path, optimizer):
    torch.manual_seed(0)
    model = mlp(6, (32, 32), 3)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt",
                                  inputs=[protocol.tensor_spec("x", [-1, 6], "float32"),
                                          protocol.tensor_spec("y", [-1], "int64")])
    before = torch._C._get_graph_executor_optimize()  # thread-local; Java calls on this thread turn it off
    module = load_for_python(path)
    eager = reference.Reference(path, model)
    g = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        assert torch.equal(module.train_step(x, y), eager.train_step(x, y))
    assert all(torch.equal(a, b) for a, b in zip(module.get_parameters(), eager.parameters().values()))
    # Attributes and submodules pass through; the thread's setting is restored afterwards.
    assert module.parameter_names() == [name for name, _ in model.named_parameters()]
    assert isinstance(module.model, torch.nn.Module)
    assert torch._C._get_graph_executor_optimize() == before
