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
