"""Fault suite, surface "in-process API": bad arguments raise gradbridge's documented errors
(InvalidInputError, JavaBuildMissingError) naming the argument, never TypeError/OverflowError
from JPype or a Java NegativeArraySizeException, and never a silent truncation (epochs=2.7).
"""

from __future__ import annotations

import numpy as np
import pytest

from gradbridge import InvalidInputError, JavaBuildMissingError, java, messages, reference

X = np.linspace(0, 1, 16, dtype=np.float32).reshape(16, 1)
Y = 2 * X + 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(epochs=2**40), "epochs must be an integer in 1..2147483647, got 1099511627776"),
    (dict(epochs=2.7), "epochs must be an integer in 1..2147483647, got 2.7"),
    (dict(epochs=0), "epochs must be an integer in 1..2147483647, got 0"),
    (dict(epochs=True), "epochs must be an integer in 1..2147483647, got True"),
    (dict(epochs=1, batch_size=2**40), "batch_size must be an integer in 1..2147483647, got 1099511627776"),
    (dict(epochs=1, seed=1.5), "seed must be an integer in -9223372036854775808..18446744073709551615, got 1.5"),
])
def test_java_train_arguments(jvm, model_path, kwargs, message):
    with pytest.raises(InvalidInputError) as info:
        java.train(model_path, X, Y, **kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("kwargs", [dict(epochs=2.7), dict(epochs=2**40)])
def test_reference_train_arguments(model_path, kwargs):
    with pytest.raises(InvalidInputError, match=r"^epochs must be an integer in 1\.\.2147483647, got "):
        reference.train(model_path, X, Y, **kwargs)


def test_zero_samples(jvm, model_path):
    empty = np.zeros((0, 1), np.float32)
    with pytest.raises(InvalidInputError) as info:
        java.train(model_path, empty, empty, epochs=1)
    assert str(info.value) == "training data: the dataset is empty (0 samples)"


@pytest.mark.parametrize("train", ["train", "train_sharded"])
def test_zero_samples_in_the_reference_are_refused_in_javas_words(model_path, train):
    empty = np.zeros((0, 1), np.float32)
    kwargs = {"shards": 2} if train == "train_sharded" else {}
    with pytest.raises(InvalidInputError) as info:
        getattr(reference, train)(model_path, empty, empty, epochs=1, batch_size=8, **kwargs)
    assert str(info.value) == "training data: the dataset is empty (0 samples)"


def test_histories_whose_parameter_shapes_differ_name_both_shapes():
    from gradbridge import EpochRecord, History
    from gradbridge.parity import compare_histories

    a = History([EpochRecord(0, 1.0, {"w": np.zeros(2)})])
    b = History([EpochRecord(0, 1.0, {"w": np.zeros((2, 1))})])
    with pytest.raises(ValueError) as info:
        compare_histories(a, b)
    assert str(info.value) == "epoch 0: parameter w has shape [2] in python but [2, 1] in java"


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=-1), "n must be an integer in 1..2147483647, got -1"),
    (dict(n=2**31), "n must be an integer in 1..2147483647, got 2147483648"),
    (dict(seed=0.5), "seed must be an integer in -9223372036854775808..9223372036854775807, got 0.5"),
])
def test_seed_data_arguments(jvm, kwargs, message):
    with pytest.raises(InvalidInputError) as info:
        java.seed_data(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("lr", [float("nan"), -0.1, float("inf"), True, "0.1"])
def test_lr_argument(jvm, model_path, lr):
    with pytest.raises(InvalidInputError, match=r"^lr must be a finite number >= 0, got "):
        java.train(model_path, X, Y, epochs=1, mode="full", lr=lr)


def test_unknown_mode_same_line_on_both_sides(jvm, model_path):
    for train in (java.train, reference.train):
        with pytest.raises(InvalidInputError) as info:
            train(model_path, X, Y, epochs=1, mode="turbo")
        assert str(info.value) == messages.unknown_mode("turbo")


def test_classpath_without_the_classes(jvm):
    with pytest.raises(JavaBuildMissingError, match=r"^the Java classpath \(.*\) lacks dev\.gradbridge\.Missing: rebuild"):
        jvm.jclass("dev.gradbridge.Missing")


def test_the_jvm_still_trains_afterwards(jvm, model_path):
    assert len(java.train(model_path, X, Y, epochs=2, batch_size=4)) == 2


def test_classpath_without_the_trainer_classes(jvm, model_path, monkeypatch):
    import jpype

    real = jpype.JClass

    def without_library(name, *args, **kwargs):
        if isinstance(name, str) and name.startswith("dev.gradbridge."):
            raise TypeError(f"Class {name} is not found")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(jpype, "JClass", without_library)
    for call in (lambda: java.train(model_path, X, Y, epochs=1), lambda: java.seed_data(n=4),
                 lambda: java.train(model_path, X, Y, epochs=1, mode="full", lr=0.1)):
        with pytest.raises(JavaBuildMissingError, match=r"^the Java classpath \(.*\) lacks dev\.gradbridge\."):
            call()


# ---- load_optimizer_state on a protocol-3 module: checked whole, one line, nothing changed ----

def _protocol_3_module(tmp_path, optimizer):
    """A protocol-3 module after two steps, and the eager reference after the same two."""
    import torch

    from gradbridge.jvm import load_module
    from tests.protocol3_support import BATCH, deep_mlp, export_protocol_3, mlp_data

    model = deep_mlp()
    opt = (torch.optim.Adam(model.parameters(), lr=0.01) if optimizer == "adam" else
           torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    path = export_protocol_3(tmp_path / "m.pt", model, opt)
    x, y = mlp_data(0)
    eager = reference.Reference(path, model)
    for _ in range(2):
        eager.train_step(x[:BATCH], y[:BATCH])
    return load_module(path), eager


def _first_only(state, key):
    import torch

    return {**state, key: [state[key][0]] + [torch.empty(0) for _ in state[key][1:]]}


@pytest.mark.parametrize("optimizer, edit, words", [
    ("adam", lambda s: {**s, "nope": s["step"]}, "load_optimizer_state: unexpected key nope"),
    ("adam", lambda s: {k: v for k, v in s.items() if k != "exp_avg"}, "load_optimizer_state: missing key exp_avg"),
    ("adam", lambda s: {**s, "exp_avg": s["exp_avg"][:-1]}, "load_optimizer_state: exp_avg has 7 tensors, expected 8"),
    ("adam", lambda s: {**s, "exp_avg_sq": [s["exp_avg_sq"][1]] + s["exp_avg_sq"][1:]},
     "load_optimizer_state: exp_avg_sq[0] has shape [8], expected [8, 4]"),
    ("adam", lambda s: {**s, "step": [t + i for i, t in enumerate(s["step"])]},
     "load_optimizer_state: step is 2 for 0.weight but 3 for 0.bias; a protocol-3 module steps its parameters together"),
    ("sgd", lambda s: _first_only(s, "momentum_buffer"),
     "load_optimizer_state: momentum_buffer is held for 1 of 8 parameters, not for 0.bias; a protocol-3 module "
     "loads it for all of them or none"),
    ("sgd", lambda s: None, "load_optimizer_state() takes {key: [one tensor per parameter]}, got null"),
])
def test_a_bad_optimizer_state_for_a_protocol_3_module_is_one_line_and_changes_nothing(jvm, tmp_path, optimizer,
                                                                                          edit, words):
    from tests.protocol3_support import java_state, tensor_values, torch_layout

    module, eager = _protocol_3_module(tmp_path, optimizer)
    try:
        before = {str(k): tensor_values(v) for k, v in module.call("optimizer_state").items()}
        state = edit(torch_layout(eager.optimizer))
        with pytest.raises(Exception) as info:
            module.call("load_optimizer_state", None if state is None else java_state(jvm, state))
        message = str(info.value.getMessage())
        assert words in message and "\n" not in message, message
        after = {str(k): tensor_values(v) for k, v in module.call("optimizer_state").items()}
        assert before.keys() == after.keys()
        assert all(np.array_equal(a, b) for k in before for a, b in zip(before[k], after[k]))
    finally:
        module.close()
