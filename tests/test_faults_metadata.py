"""Fault suite, surface "metadata": malformed gradbridge.json gives one line, the same in both languages.

Before, an array, a missing key or a null shape gave a Java NullPointerException trace or a Python
traceback, the string version "1" was accepted by Java and refused by Python as "version 1, this
gradbridge reads 1", and parameter shapes were never compared with the module's.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradbridge import ProtocolError, messages, protocol, reference
from gradbridge.jvm import load_module
from tests.faults import gradbridge_cli, one_error_line, rewrite_metadata, train_cli


def _set(path, value):
    def edit(document):
        target = document
        for key in path[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return document
    return edit


def _key(key, expected, actual):
    return lambda path: messages.metadata_key(path, key, expected, actual)


CASES = {
    "array": (lambda document: [document["format"]],
              lambda path: messages.metadata_document(path, '["gradbridge.training-module"]')),
    "missing_loss": (_set(["loss"], KeyError), _key("loss", "an object with a name", messages.MISSING)),
    "null_shape": (_set(["parameters", 0, "shape"], None), _key("parameters[0].shape", "a list of integers", "null")),
    "string_version": (_set(["protocol_version"], "1"), _key("protocol_version", "an integer", '"1"')),
    "float_dim": (_set(["inputs", 0, "shape"], [-1, 1.5]), _key("inputs[0].shape", "a list of integers", "[-1,1.5]")),
    "bad_dtype": (_set(["parameters", 1, "dtype"], "complex64"),
                  _key("parameters[1].dtype", f"one of {', '.join(protocol.PARAMETER_DTYPES)}", '"complex64"')),
    "bad_buffer_dtype": (_set(["buffers"], [{"name": "freqs", "shape": [2], "dtype": "complex64"}]),
                         _key("buffers[0].dtype", f"one of {', '.join(protocol.BUFFER_DTYPES)}", '"complex64"')),
    "string_persistent": (_set(["buffers"], [{"name": "mask", "shape": [2], "dtype": "bool", "persistent": "no"}]),
                          _key("buffers[0].persistent", "true or false", '"no"')),
    "no_y": (_set(["inputs"], [{"name": "x", "shape": [-1, 1], "dtype": "float32"}]),
             _key("inputs", messages.INPUT_SPECS, '["x"]')),
    "missing_methods": (_set(["methods"], KeyError), _key("methods", "a list of strings", messages.MISSING)),
}


@pytest.fixture(scope="module")
def crafted(models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-metadata")
    files = {name: rewrite_metadata(models["linear_regression.pt"], folder / f"{name}.pt", edit)
             for name, (edit, _) in CASES.items()}
    files["wrong_shape"] = rewrite_metadata(models["linear_regression.pt"], folder / "wrong_shape.pt",
                                            _set(["parameters", 0, "shape"], [1, 1]))
    data = folder / "data.npz"
    x = np.linspace(0, 1, 20, dtype=np.float32).reshape(20, 1)
    np.savez(data, x=x, y=2 * x + 1)
    files["data"] = data
    return files


@pytest.mark.parametrize("name", sorted(CASES))
def test_python_names_the_key(crafted, name):
    with pytest.raises(ProtocolError) as info:
        protocol.read_metadata(crafted[name])
    assert str(info.value) == CASES[name][1](str(crafted[name]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_java_says_the_same(jvm, crafted, name):
    with pytest.raises(ProtocolError) as info:
        load_module(crafted[name])
    assert str(info.value) == CASES[name][1](str(crafted[name])) + " [dev.gradbridge.ProtocolException]"


@pytest.mark.parametrize("name", ["null_shape", "string_version", "array"])
def test_clis_print_one_line(crafted, name):
    expected = CASES[name][1](str(crafted[name]))
    assert one_error_line(train_cli("--model", crafted[name], "--data", crafted["data"])) == expected
    parity = gradbridge_cli("parity", crafted[name], "--data", crafted["data"], "--epochs", 1)
    assert one_error_line(parity, prefix="gradbridge: error: ") == expected


def test_parameter_shapes_are_compared_with_the_module(jvm, crafted):
    path = str(crafted["wrong_shape"])
    expected = messages.parameter_mismatch(path, "weight", "float32 [1, 1]", "float32 [1]")
    with pytest.raises(ProtocolError) as in_java:
        load_module(path)
    assert str(in_java.value) == expected + " [dev.gradbridge.ProtocolException]"
    with pytest.raises(ProtocolError) as in_python:
        reference.Reference(path)
    assert str(in_python.value) == expected
    assert one_error_line(train_cli("--model", path, "--data", crafted["data"])) == expected
