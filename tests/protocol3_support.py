"""What the protocol-3 tests share (tests/test_protocol3.py, test_faults_inprocess_api.py): the MLP's data and
a deeper model, the export with cross entropy, and torch.optim's state in the layout a module's
load_optimizer_state takes, as Java values and back."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from gradbridge import export_training_module

from .data import labelled

N, BATCH = 24, 8


def mlp_data(seed):
    """N rows of 4 features and labels in 0..2 drawn independently of them (tensors)."""
    return labelled(N, 4, seed=seed, tensors=True, labels="random")


def deep_mlp():
    """An MLP with BatchNorm, dropout and a tanh (seeded: the same parameters each time)."""
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 3))


def export_protocol_3(path, model, optimizer, data=None, **options):
    """``format="export"`` with cross entropy, its examples a batch of ``data`` (x, y; the MLP's by default)."""
    x, y = data if data is not None else mlp_data(0)
    return export_training_module(model, "cross_entropy", optimizer, path, example_inputs=(x[:BATCH], y[:BATCH]),
                                  format="export", **options)


def torch_layout(optimizer):
    """torch.optim's state dict as load_optimizer_state takes it: per key, the tensor of each parameter that
    holds it, in group order."""
    state = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state[p].items():
                state.setdefault(key, []).append(value)
    return state


def java_state(jvm, state):
    """{key: [tensor]} as a Java map of tensor lists."""
    java_map = jvm.jclass("java.util.LinkedHashMap")()
    for key, values in state.items():
        tensors = jvm.jclass("java.util.ArrayList")()
        for value in values:
            tensors.add(jvm.to_tensor(value.detach().numpy()))
        java_map.put(key, tensors)
    return java_map


def tensor_values(tensors):
    """Java tensors' values as numpy arrays (float64)."""
    return [np.array(list(t.toExactDoubles())) for t in tensors]
