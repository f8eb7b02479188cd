"""The parity matrix: real data sets shipped inside scikit-learn, five models, four optimizers,
three ways of batching. Shared by tests/test_matrix.py and its report."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, Tuple

import numpy as np
import torch
from torch import nn

from gradbridge import protocol, verify
from gradbridge.models import SmallCNN, linear, mlp

OPTIMIZERS: Dict[str, dict] = {
    "sgd": {"name": "sgd", "lr": 0.05},
    "sgd-nesterov-wd": {"name": "sgd", "lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4},
    "adam": {"name": "adam", "lr": 0.005},
    "adamw": {"name": "adamw", "lr": 0.005, "weight_decay": 0.01},
}
MODES = protocol.MODES
# Every optimizer option the exporter supports, one case each: `gradbridge verify`'s (tests/test_optim.py,
# test_parity_java_general.py)
OPTIMIZER_VARIANTS = verify.OPTIMIZER_VARIANTS
RESULTS = []  # (case, mode, side, verdict) for the parity-matrix table printed at the end of the session
BATCH = 32


def _standardize(values: np.ndarray) -> np.ndarray:
    return ((values - values.mean(axis=0)) / values.std(axis=0)).astype(np.float32)


@lru_cache(maxsize=None)
def dataset(name: str) -> Tuple[np.ndarray, np.ndarray]:
    """(x, y) as the models take them; features standardized (digits scaled to [0, 1])."""
    from sklearn import datasets

    if name == "diabetes":
        x, y = datasets.load_diabetes(return_X_y=True)
        return _standardize(x), _standardize(y.reshape(-1, 1))
    if name == "breast_cancer":
        x, y = datasets.load_breast_cancer(return_X_y=True)
        return _standardize(x), y.astype(np.float32).reshape(-1, 1)
    if name == "iris":
        x, y = datasets.load_iris(return_X_y=True)
        return _standardize(x), y.astype(np.int64)
    if name == "digits":
        x, y = datasets.load_digits(return_X_y=True)
        return (x / 16.0).astype(np.float32), y.astype(np.int64)
    if name == "digits-8x8":
        x, y = dataset("digits")
        return x.reshape(-1, 1, 8, 8), y
    raise KeyError(name)


@dataclass(frozen=True)
class Model:
    name: str
    data: str
    loss: str
    build: Callable[[], nn.Module]


MODELS = {
    "linear-regression": Model("linear-regression", "diabetes", "mse", lambda: linear(10, 1)),
    "logistic-regression": Model("logistic-regression", "breast_cancer", "bce_with_logits", lambda: linear(30, 1)),
    "mlp-classifier": Model("mlp-classifier", "iris", "cross_entropy", lambda: mlp(4, (16, 16), 3)),
    "cnn-batchnorm": Model("cnn-batchnorm", "digits-8x8", "cross_entropy", lambda: SmallCNN(side=8, channels=4, classes=10)),
    "mlp-dropout": Model("mlp-dropout", "digits", "cross_entropy", lambda: mlp(64, (32,), 10, dropout=0.2)),
}

CASES = list(itertools.product(MODELS, OPTIMIZERS, MODES))

#: The cases of the default run: each model with each optimizer once, the mode turning with both, so every
#: model and every optimizer also meets every mode (20 of the 60; `--full` runs them all).
DEFAULT_CASES = [(model, optimizer, MODES[(i + j) % len(MODES)])
                 for i, model in enumerate(MODELS) for j, optimizer in enumerate(OPTIMIZERS)]

#: The cases also run through `gradle train` in CI: every model, optimizer and mode at least once.
SUBPROCESS_CASES = [
    ("linear-regression", "sgd", "full"),
    ("logistic-regression", "adamw", "fused"),
    ("mlp-classifier", "sgd-nesterov-wd", "step"),
    ("cnn-batchnorm", "adam", "fused"),
    ("mlp-dropout", "sgd-nesterov-wd", "step"),
]


def export(model_name: str, optimizer: str, folder: Path) -> Path:
    from gradbridge import export_training_module

    model = MODELS[model_name]
    x, y = dataset(model.data)
    torch.manual_seed(0)
    return export_training_module(model.build(), model.loss, OPTIMIZERS[optimizer],
                                  folder / f"{model_name}-{optimizer}.pt",
                                  example_inputs=(torch.from_numpy(x[:4]), torch.from_numpy(y[:4])),
                                  model_name=model_name)
