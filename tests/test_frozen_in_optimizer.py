"""Frozen and gradient-less parameters inside the optimizer, as torch does it: ``AdamW(model.parameters())``
on a model with requires_grad=False parameters (a PEFT LoRA model's base, HF Whisper's positional
embedding) or with a parameter the loss never reaches. torch.optim keeps them in their group, never
steps them and creates no state for them; Java trains such a model bit for bit like the user's own
eager optimizer, in both formats, checkpoints and resumes included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradbridge import compare_histories, export_training_module, java, reference
from gradbridge._runtime import shuffle
from gradbridge.history import digest

from .data import labelled

FORMATS = ["torchscript", "export"]


class WithUnused(nn.Module):
    """A head the loss never reaches: trainable, but never given a gradient."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        self.unused = nn.Linear(6, 3)

    def forward(self, x):
        return self.body(x)


def _frozen_mlp(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    model[0].weight.requires_grad_(False)
    return model


def _eager_full_batch(model, optimizer, x, y, epochs, seed=0):
    """The user's own eager loop: one full-batch step per epoch, with the user's optimizer."""
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(epochs):
        torch.manual_seed(shuffle.torch_seed(seed, epoch))
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()


def _digests(model):
    return {name: digest(p.detach().numpy(), "float32") for name, p in model.named_parameters()}


def _java_state(jvm, path):
    """The optimizer state Java's module holds (a checkpoint's), {key: [float64 array per parameter]}."""
    module = jvm.load_module(path)
    try:
        return {str(k): [np.array(v, dtype=np.float64) for v in values]
                for k, values in module.getOptimizerState().items()}
    finally:
        module.close()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("make", [_frozen_mlp, lambda: (torch.manual_seed(0), WithUnused())[1]],
                         ids=["frozen", "unused"])
def test_the_whole_model_in_adamw_trains_as_the_users_own_optimizer(jvm, tmp_path, fmt, make):
    # Given AdamW over model.parameters(), one of them frozen or never reached by the loss
    model = make()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    x, y = labelled(32, tensors=True)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x, y),
                                  format=fmt)
    # When Java trains it (full batch, 3 epochs, a checkpoint) and the reference does on the user's model
    checkpoint = tmp_path / "c.pt"
    in_java = java.train(path, x.numpy(), y.numpy(), epochs=3, mode="full", checkpoint=checkpoint)
    in_python = reference.train(path, x.numpy(), y.numpy(), epochs=3, mode="full", model=model)
    assert compare_histories(in_python, in_java).bitwise
    # Then the user's own loop with the user's own AdamW (frozen one included) ends on the same bits
    _eager_full_batch(model, optimizer, x, y, epochs=3)
    assert in_java[-1].digests == _digests(model)
    # ... and the state Java keeps is torch's: none for a frozen parameter; for one the loss never reaches,
    # none in protocol 3 (left out of its group at export), its untouched initial state in TorchScript
    # (step 0, zeros: what torch's first step would create; the module's state lists are positional)
    stepped = [p for p in model.parameters() if p in optimizer.state]
    assert len(stepped) == sum(1 for p in model.parameters()) - (1 if make is _frozen_mlp else 2)
    keep = [p for p in model.parameters() if p.requires_grad and (fmt == "torchscript" or p in optimizer.state)]
    state = _java_state(jvm, checkpoint)
    assert {key: len(values) for key, values in state.items()} == {"step": len(keep), "exp_avg": len(keep),
                                                                   "exp_avg_sq": len(keep)}
    for key, values in state.items():
        for mine, p in zip(values, keep):
            expected = optimizer.state[p][key].double().numpy().ravel() if p in optimizer.state else 0.0 * mine
            assert np.array_equal(mine, expected), key


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_frozen_parameter_in_the_group_resumes_bitwise(jvm, tmp_path, fmt):
    model = _frozen_mlp(1)
    x, y = labelled(32, seed=1, tensors=True)
    path = export_training_module(model, "cross_entropy", torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  tmp_path / "m.pt", example_inputs=(x[:8], y[:8]), format=fmt)
    straight = java.train(path, x.numpy(), y.numpy(), epochs=4, batch_size=8, seed=2)
    java.train(path, x.numpy(), y.numpy(), epochs=2, batch_size=8, seed=2, checkpoint=tmp_path / "c.pt")
    resumed = java.train(tmp_path / "c.pt", x.numpy(), y.numpy(), epochs=2)
    assert [r.digests for r in resumed] == [r.digests for r in straight[2:]]
    eager = reference.train(path, x.numpy(), y.numpy(), epochs=4, batch_size=8, seed=2, model=model)
    assert compare_histories(eager, straight).bitwise
    assert straight[-1].digests["0.weight"] == digest(model[0].weight.detach().numpy(), "float32")  # never moved


def test_a_peft_lora_model_with_its_whole_model_in_the_optimizer(jvm, tmp_path):
    """PEFT freezes the base; most tutorials still give AdamW model.parameters()."""
    import peft  # in the test extra (pyproject.toml): never skipped

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 3)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    torch.manual_seed(0)
    model = peft.get_peft_model(Net(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["fc1"], lora_dropout=0.0,
                                                       init_lora_weights=False))
    assert any(not p.requires_grad for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    x, y = labelled(32, tensors=True)
    for fmt in FORMATS:
        path = export_training_module(model, "cross_entropy", optimizer, tmp_path / f"{fmt}.pt",
                                      example_inputs=(x[:8], y[:8]), format=fmt)
        in_java = java.train(path, x.numpy(), y.numpy(), epochs=2, batch_size=8)
        in_python = reference.train(path, x.numpy(), y.numpy(), epochs=2, batch_size=8, model=model)
        assert compare_histories(in_python, in_java).bitwise, fmt
        frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
        assert all(in_java[-1].digests[n] == in_java[0].digests[n] for n in frozen)
