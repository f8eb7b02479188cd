"""Fine-tuning cases of the parity matrix, on real data (scikit-learn's digits).

- cnn-finetune: a CNN trained on the first 900 digits in Python, saved as a state_dict; exported
  from it with its convolutions frozen and a new head, AdamW with a warm-up + cosine schedule per
  step; trained from Java on the other digits;
- param-groups: an MLP with two AdamW groups (different lr and weight decay);
- clip-norm / clip-value: SGD with momentum, gradients clipped before every step;
- accumulation: the CNN with 4 micro-batches per step and a per-epoch StepLR;
- plateau: ReduceLROnPlateau on the validation loss;
- recommender: embeddings of (image, pixel) index pairs (int64 inputs) -> the pixel's intensity.

Each in step, fused and full-batch mode, Java in this process against eager PyTorch: bitwise
(losses, parameters and the lr of every group, every epoch). Two cases also run in a JVM of their
own (the pytorch-native-cpu jar's libtorch), within the stated tolerance. Results join the matrix table.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as ls

from gradbridge import export_training_module, java, reference
from gradbridge._runtime import launcher
from gradbridge.models import SmallCNN, mlp
from gradbridge.parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL, assert_histories_match
from tests import matrix

EPOCHS = 4
BATCH = 32
MODES = matrix.MODES
USERS = 40  # digit images of the recommender (users); its items are the 64 pixels
PRETRAIN = 900  # digits used to pre-train the CNN in Python; Java fine-tunes on the rest


@lru_cache(maxsize=None)
def _pretrained_cnn_state() -> dict:
    """A SmallCNN trained in eager PyTorch for 3 epochs on the first digits (the 'pretrained' model)."""
    x, y = matrix.dataset("digits-8x8")
    xs, ys = torch.from_numpy(x[:PRETRAIN]), torch.from_numpy(y[:PRETRAIN])
    torch.manual_seed(0)
    model = SmallCNN(side=8, channels=4, classes=10)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        for start in range(0, PRETRAIN, 64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xs[start:start + 64]), ys[start:start + 64]).backward()
            optimizer.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def _digits_rest():
    x, y = matrix.dataset("digits-8x8")
    return x[PRETRAIN:], y[PRETRAIN:]


def _recommender_data():
    """(image, pixel) -> intensity for the first USERS digit images: 2,560 real ratings."""
    from sklearn import datasets

    images = datasets.load_digits().data[:USERS] / 16.0
    users, items = np.meshgrid(np.arange(USERS), np.arange(64), indexing="ij")
    x = np.stack([users.ravel(), items.ravel()], axis=1).astype(np.int64)
    return x, images.ravel().astype(np.float32).reshape(-1, 1)


class Recommender(nn.Module):
    def __init__(self, users: int = 40, items: int = 64, dim: int = 8):
        super().__init__()
        self.users = nn.Embedding(users, dim)
        self.items = nn.Embedding(items, dim)
        self.head = nn.Linear(2 * dim, 1)

    def forward(self, x):
        return self.head(torch.cat([self.users(x[:, 0]), self.items(x[:, 1])], dim=1))


def _cnn_finetune(path: Path):
    """Pretrained state_dict in, convolutions frozen, new head, warm-up + cosine per step."""
    model = SmallCNN(side=8, channels=4, classes=10)
    model.load_state_dict(_pretrained_cnn_state())
    torch.manual_seed(1)
    model.head.reset_parameters()  # the new head
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(state, path.with_suffix(".weights"))
    fresh = SmallCNN(side=8, channels=4, classes=10)  # its own init is replaced by the file's weights
    for p in fresh.features.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(fresh.head.parameters(), lr=0.01)
    warmup_cosine = ls.SequentialLR(optimizer, [ls.LinearLR(optimizer, 0.1, total_iters=10),
                                                ls.CosineAnnealingLR(optimizer, T_max=60)], milestones=[10])
    x, y = _digits_rest()
    exported = export_training_module(fresh, "cross_entropy", optimizer, path, scheduler=warmup_cosine,
                                      init_weights=path.with_suffix(".weights"),
                                      example_inputs=(torch.from_numpy(x[:4]), torch.from_numpy(y[:4])))
    fresh.load_state_dict(state)
    return exported, fresh, (x, y), None


def _mlp_digits():
    torch.manual_seed(0)
    return mlp(64, (32,), 10)


def _digits_flat():
    return matrix.dataset("digits")


def _param_groups(path: Path):
    model = _mlp_digits()
    optimizer = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 1e-3, "weight_decay": 0.05},
                                   {"params": model[2].parameters(), "weight_decay": 0.0}], lr=0.01)
    x, y = _digits_flat()
    return export_training_module(model, "cross_entropy", optimizer, path,
                                  example_inputs=(torch.from_numpy(x[:4]), torch.from_numpy(y[:4]))), model, (x, y), None


def _clip(kind):
    def build(path: Path):
        model = _mlp_digits()
        x, y = _digits_flat()
        option = {"clip_grad_norm": 0.5} if kind == "norm" else {"clip_grad_value": 0.02}
        return export_training_module(model, "cross_entropy", {"name": "sgd", "lr": 0.2, "momentum": 0.9}, path,
                                      example_inputs=(torch.from_numpy(x[:4]), torch.from_numpy(y[:4])),
                                      **option), model, (x, y), None
    return build


def _accumulation(path: Path):
    torch.manual_seed(0)
    model = SmallCNN(side=8, channels=4, classes=10)
    x, y = matrix.dataset("digits-8x8")
    return export_training_module(model, "cross_entropy", {"name": "adam", "lr": 0.005}, path, accumulate=4,
                                  scheduler={"name": "step", "step_size": 2, "gamma": 0.5}, scheduler_interval="epoch",
                                  example_inputs=(torch.from_numpy(x[:4]), torch.from_numpy(y[:4]))), model, (x, y), None


def _plateau(path: Path):
    model = _mlp_digits()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    scheduler = ls.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.1)
    x, y = _digits_flat()
    exported = export_training_module(model, "cross_entropy", optimizer, path, scheduler=scheduler,
                                      example_inputs=(torch.from_numpy(x[:4]), torch.from_numpy(y[:4])))
    return exported, model, (x[:1400], y[:1400]), (x[1400:], y[1400:])


def _recommender(path: Path):
    torch.manual_seed(0)
    model = Recommender()
    x, y = _recommender_data()
    optimizer = torch.optim.Adam([{"params": [model.users.weight, model.items.weight], "lr": 0.05},
                                  {"params": model.head.parameters()}], lr=0.01)
    return export_training_module(model, "mse", optimizer, path, clip_grad_norm=5.0,
                                  example_inputs=(torch.from_numpy(x[:4]), torch.from_numpy(y[:4]))), model, (x, y), None


CASES = {"cnn-finetune": _cnn_finetune, "param-groups": _param_groups, "clip-norm": _clip("norm"),
         "clip-value": _clip("value"), "accumulation": _accumulation, "plateau": _plateau,
         "recommender": _recommender}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("finetune-matrix")
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = CASES[name](folder / f"{name}.pt")
        return cache[name]
    return get


def _settings(mode):
    return dict(epochs=EPOCHS, batch_size=128 if mode == "full" else BATCH, seed=1, mode=mode)


@pytest.mark.parametrize("name, mode", [(c, m) for c in CASES for m in MODES],
                         ids=[f"{c}-{m}" for c in CASES for m in MODES])
def test_fine_tuning_in_process(jvm, built, name, mode):
    path, model, (x, y), val = built(name)
    settings = _settings(mode)
    if mode == "full":  # full batch: one step per epoch on a slice, more epochs
        x, y = x[:256], y[:256]
        settings.update(batch_size=256, epochs=8)
    in_java = java.train(path, x, y, val=val, **settings)
    in_python = reference.train(path, x, y, model=model, val=val, **settings)
    report = assert_histories_match(in_python, in_java)
    matrix.RESULTS.append((f"finetune {name}", mode, "in-process", report))
    assert report.bitwise
    assert all(r.lrs is not None for r in in_java) and [r.lrs for r in in_java] == [r.lrs for r in in_python]


@pytest.mark.parametrize("name", ["cnn-finetune", "recommender"])
def test_fine_tuning_in_a_jvm_of_its_own(built, tmp_path, name):
    path, model, (x, y), val = built(name)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    settings = _settings("step")
    history = launcher.train(path, tmp_path / "data.npz", history=tmp_path / "h.jsonl", **settings)
    in_python = reference.train(path, x, y, model=model, **settings)
    report = assert_histories_match(in_python, history, rtol=SEPARATE_JVM_RTOL, atol=SEPARATE_JVM_ATOL)
    matrix.RESULTS.append((f"finetune {name}", "step", "subprocess", report))
    assert report.within_tolerance
