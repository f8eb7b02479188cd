"""The online demo's recommender (`gradbridge online-demo`): the model, the click simulator, the online
metrics, and the run that learns online in Java from the simulated stream.

The click stream comes from a known preference model (generated, nothing downloaded): hidden user
and item vectors, click probability ``sigmoid(3 * <u, v> - 1)``. Each round shows a batch of
(user, item) impressions: the Java learner predicts them first (progressive validation: the
version that answered never saw those clicks), then the clicks go back as feedback.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

import numpy as np
import torch
from torch import nn

from . import online, protocol
from .export import export_training_module
from ._runtime.files import atomic_path
from .replay import ReplayReport, replay

#: The demo's sizes and learning rate.
USERS, ITEMS, DIM, LR = 200, 100, 8, 0.05


class Recommender(nn.Module):
    """Matrix factorization: logit = <user embedding, item embedding> + item bias."""

    def __init__(self, users: int = 200, items: int = 100, dim: int = 8):
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)
        self.item_bias = nn.Embedding(items, 1)
        with torch.no_grad():
            self.user.weight.mul_(0.1)
            self.item.weight.mul_(0.1)
            self.item_bias.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.user(x[:, 0])
        v = self.item(x[:, 1])
        return (u * v).sum(dim=1, keepdim=True) + self.item_bias(x[:, 1])


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties averaged); NaN when one class is absent."""
    positives = labels == 1
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def log_loss(logits: np.ndarray, labels: np.ndarray) -> float:
    z = logits.astype(np.float64)
    return float(np.mean(np.logaddexp(0, z) - labels * z))


def export(path: Path, users: int, items: int, dim: int, lr: float) -> Path:
    torch.manual_seed(0)
    inputs = [protocol.tensor_spec("x", [-1, 2], "int64"), protocol.tensor_spec("y", [-1, 1], "float32")]
    return export_training_module(Recommender(users, items, dim), {"name": "bce_with_logits"},
                                  {"name": "adam", "lr": lr}, path, inputs=inputs, model_name="recommender")


class ClickSimulator:
    """Impressions of random (user, item) pairs and the clicks the hidden preference model gives them."""

    def __init__(self, users: int, items: int, seed: int = 0, hidden_dim: int = 4):
        self.users, self.items = users, items
        self.rng = np.random.default_rng(seed)
        self.true_users = self.rng.standard_normal((users, hidden_dim)) / 2
        self.true_items = self.rng.standard_normal((items, hidden_dim)) / 2

    def impressions(self, batch: int) -> np.ndarray:
        return np.stack([self.rng.integers(self.users, size=batch), self.rng.integers(self.items, size=batch)],
                        axis=1).astype(np.int64)

    def clicks(self, x: np.ndarray) -> np.ndarray:
        p = 1 / (1 + np.exp(-(3 * (self.true_users[x[:, 0]] * self.true_items[x[:, 1]]).sum(axis=1) - 1)))
        return (self.rng.random(len(x)) < p).astype(np.float32).reshape(len(x), 1)


@dataclass
class DemoResult:
    rounds: int
    batch: int
    seconds: float
    #: per window of rounds: (first version, last version, events, online AUC, log-loss)
    windows: List[Tuple[int, int, int, float, float]]
    plot: Path
    log_dir: Path
    replay: ReplayReport

    @property
    def auc_rose(self) -> bool:
        return self.windows[-1][3] > self.windows[0][3]


def run_demo(rounds: int = 300, batch: int = 64, out_dir: str = "build/online-demo", seed: int = 0) -> DemoResult:
    """Learn online from ``rounds`` rounds of ``batch`` impressions (predict, then feedback), measure each
    window's online AUC and log-loss, plot them into ``out_dir/online.png``, and replay the log in Python."""
    out_path = Path(out_dir)
    log_dir = out_path / "log"
    shutil.rmtree(log_dir, ignore_errors=True)
    model_path = export(out_path / "recommender.pt", USERS, ITEMS, DIM, lr=LR)
    simulator = ClickSimulator(USERS, ITEMS, seed)

    learner = online.open_learner(model_path, log_dir, max_batch=batch, max_wait_ms=2, publish_every=1,
                                  checkpoint_every=50, fsync="never")

    def next_round():
        x = simulator.impressions(batch)
        return x, simulator.clicks(x)

    # Users come back slower than the model learns: each round sees the update of the one before.
    elapsed, rows = online.progressive(learner, rounds, next_round, lambda logits, clicks: (
        auc(logits.ravel(), clicks.ravel()), log_loss(logits.ravel(), clicks.ravel())))
    plot = _plot(out_path / "online.png", rows)
    return DemoResult(rounds, batch, elapsed, rows, plot, log_dir, replay(log_dir, model_path))


def _plot(path: Path, rows) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    versions = [(first + last) / 2 for first, last, *_ in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(versions, [r[3] for r in rows], marker="o")
    top.set_ylabel("online AUC")
    top.set_title("recommender learning online in Java (progressive validation)")
    bottom.plot(versions, [r[4] for r in rows], marker="o", color="tab:red")
    bottom.set_ylabel("log-loss")
    bottom.set_xlabel("model version")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return path
