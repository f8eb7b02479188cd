"""Fault suite, surface "gradbridge-spark": bad input to the Spark trainer is one ``error:`` line
(exit code 1, no stack trace) before any step, and nothing is written. Modules of protocol 1 still
load and train single-process; the Spark trainer and the sharded replay refuse them with the same
line. (Task and executor failures mid-step are in ``test_spark.py``: they must not change the run.)
"""

from __future__ import annotations

import numpy as np
import pytest

from gradbridge import ProtocolError, messages, protocol, reference, sparkrun
from gradbridge.export import export_builtin
from gradbridge.export import training_module
from tests.faults import one_error_line, rewrite_metadata, stray_files, train_cli

INPUTS = [protocol.tensor_spec("x", [-1, 4], "float32"), protocol.tensor_spec("y", [-1], "int64")]


class _ProtocolOne(training_module._TrainingModule):
    """The wrapper as it was before protocol 2: the two methods exist in Python but are not
    exported, so the scripted module lacks them (a subclass: TorchScript caches compiled classes)."""

    def gradient_flags(self):
        raise NotImplementedError

    def set_gradients(self, values, flags):
        raise NotImplementedError


def _export_protocol_one(path):
    """An export as gradbridge wrote it before protocol 2: no gradient_flags, no set_gradients."""
    original = training_module._TrainingModule
    training_module._TrainingModule = _ProtocolOne
    try:
        raw = export_builtin("mlp", path.with_name("raw_" + path.name), seed=0, in_features=4, hidden=(8,),
                             out_features=3, loss={"name": "cross_entropy"}, optimizer={"name": "sgd", "lr": 0.1},
                             inputs=INPUTS, fine_tuning={"check": False})  # the check needs gradient_flags
    finally:
        training_module._TrainingModule = original

    def as_version_one(document):
        document["protocol_version"] = 1
        document["methods"] = [m for m in document["methods"] if m not in protocol.DATA_PARALLEL_METHODS]
        return document

    return rewrite_metadata(raw, path, as_version_one)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spark-faults")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 4)).astype(np.float32)
    y = rng.integers(0, 3, 40).astype(np.int64)
    np.savez(folder / "data.npz", x=x, y=y)
    np.savez(folder / "three_rows.npz", x=x[:3], y=y[:3])
    np.savez(folder / "x64.npz", x=x.astype(np.float64), y=y)
    np.savez(folder / "x3.npz", x=x[:, :3].copy(), y=y)
    sparkrun.to_parquet([(folder / "x64.npz", folder / "x64.parquet"), (folder / "x3.npz", folder / "x3.parquet")])
    good = export_builtin("mlp", folder / "mlp.pt", seed=0, in_features=4, hidden=(8,), out_features=3,
                          loss={"name": "cross_entropy"}, optimizer={"name": "sgd", "lr": 0.1}, inputs=INPUTS)
    cnn = export_builtin("small-cnn", folder / "cnn.pt", seed=0, side=8, channels=2, classes=3,
                         loss={"name": "cross_entropy"}, optimizer={"name": "sgd", "lr": 0.1},
                         inputs=[protocol.tensor_spec("x", [-1, 1, 8, 8], "float32"),
                                 protocol.tensor_spec("y", [-1], "int64")])
    return {"folder": folder, "x": x, "y": y, "good": good, "cnn": cnn,
            "v1": _export_protocol_one(folder / "protocol1.pt")}


def refused(files, tmp_path, *args, master="local[2]") -> str:
    """Run the trainer with a history and checkpoint asked for; its one error line; nothing written."""
    result = sparkrun.run(["--master", master, "--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt",
                           *map(str, args)], check=False)
    line = one_error_line(result)
    assert stray_files(tmp_path) == []
    return line


def test_protocol_one_module_still_loads_and_trains_single_process(files, tmp_path):
    assert protocol.read_metadata(files["v1"])["protocol_version"] == 1
    result = train_cli("--model", files["v1"], "--data", files["folder"] / "data.npz", "--epochs", "1",
                       "--history", tmp_path / "h.jsonl")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "h.jsonl").exists()


def test_protocol_one_module_is_refused_by_spark_and_the_replay(files, tmp_path):
    expected = messages.data_parallel_methods(str(files["v1"]), 1, list(protocol.DATA_PARALLEL_METHODS))
    assert refused(files, tmp_path, "--model", files["v1"], "--data", files["folder"] / "data.npz") == expected
    with pytest.raises(ProtocolError) as error:
        reference.train_sharded(files["v1"], files["x"], files["y"], epochs=1, shards=2)
    assert str(error.value) == expected


def test_module_with_buffers_is_refused(files, tmp_path):
    buffers = [b["name"] for b in protocol.read_metadata(files["cnn"])["buffers"]]
    assert buffers  # BatchNorm statistics
    expected = messages.data_parallel_buffers(str(files["cnn"]), buffers)
    assert refused(files, tmp_path, "--model", files["cnn"], "--data", files["folder"] / "data.npz") == expected


def test_parquet_column_of_the_wrong_dtype(files, tmp_path):
    line = refused(files, tmp_path, "--model", files["good"], "--data", files["folder"] / "x64.parquet")
    assert line == (f"{files['folder'] / 'x64.parquet'}: column x must be array<float> (float32 of shape [-1, 4] "
                    "in the model's metadata), got array<double>")


def test_parquet_rows_of_the_wrong_shape(files, tmp_path):
    line = refused(files, tmp_path, "--model", files["good"], "--data", files["folder"] / "x3.parquet")
    assert line == (f"{files['folder'] / 'x3.parquet'}: column x rows must hold 4 values (float32 of shape [-1, 4] "
                    "in the model's metadata), found rows of 3 values")


def test_empty_partition(files, tmp_path):
    data = files["folder"] / "three_rows.npz"
    line = refused(files, tmp_path, "--model", files["good"], "--data", data, "--partitions", "4")
    assert line == f"{data}: 3 rows cannot fill 4 partitions (partition 3 would be empty); use at most 3 partitions"


def test_a_newer_protocol_version_is_refused_by_both_languages(files, tmp_path):
    future = rewrite_metadata(files["good"], files["folder"] / "protocol3.pt",
                              lambda document: {**document, "protocol_version": 3})
    with pytest.raises(ProtocolError, match=r"protocol version 3, this gradbridge reads 1 and 2$"):
        protocol.read_metadata(future)
    line = refused(files, tmp_path, "--model", future, "--data", files["folder"] / "data.npz")
    assert line == (f"{future}: protocol version 3, this gradbridge reads versions [1, 2]. "
                    "Re-export the module with a matching gradbridge.")


@pytest.mark.parametrize("setting, value, line", [
    ("spark.gradbridge.exchange", "ring", "spark.gradbridge.exchange must be gloo or relay, got ring"),
    *[("spark.gradbridge.exchange.oneRoundBytes", value,
       f"spark.gradbridge.exchange.oneRoundBytes must be a whole number of bytes in 0..536870912, got {value}")
      for value in ("-1", "256k", "536870913")]])
def test_a_bad_exchange_setting(files, tmp_path, setting, value, line):
    result = sparkrun.run(["--master", "local[2]", "--model", files["good"], "--data", files["folder"] / "data.npz",
                           "--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt"],
                          check=False, jvm_options=[f"-D{setting}={value}"])
    assert one_error_line(result) == line
    assert stray_files(tmp_path) == []
