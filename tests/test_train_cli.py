"""`gradbridge-train` (from `gradle installDist`) and `gradle train`: results and bad input.

Each bad input must end with exit code 1, exactly one `error:` line naming the problem, and no
history or checkpoint written.
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from gradbridge import History, compare_histories, protocol, reference
from gradbridge._runtime.gradle import run_task
from gradbridge._runtime.devtree import root

REPO_ROOT = root()

SCRIPT = REPO_ROOT / "build" / "install" / "gradbridge" / "bin" / "gradbridge-train"
# gradle train runs the pytorch-native-cpu jar's libtorch build, not pip's: allow float32-level differences.
RTOL, ATOL = 1e-5, 1e-6


def _train(*args):
    assert SCRIPT.exists(), f"{SCRIPT} is missing: run `gradle installDist` (part of `make test`)"
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=REPO_ROOT)


def _classification(n, features=4, seed=0):
    g = np.random.default_rng(seed)
    x = g.standard_normal((n, features)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    x, y = _classification(60)
    files = {"good": folder / "good.npz", "val": folder / "val.npz"}
    np.savez(files["good"], x=x, y=y)
    np.savez(files["val"], x=_classification(20, seed=1)[0], y=_classification(20, seed=1)[1])
    bad = {
        "missing_key": dict(inputs=x, y=y),
        "wrong_dtype": dict(x=x.astype(np.float64), y=y),
        "wrong_shape": dict(x=np.zeros((60, 5), np.float32), y=y),
        "empty": dict(x=np.zeros((0, 4), np.float32), y=np.zeros((0,), np.int64)),
        "nan": dict(x=np.where(np.arange(240).reshape(60, 4) == 17, np.nan, x).astype(np.float32), y=y),
        "target_dtype": dict(x=x, y=y.astype(np.float32)),
    }
    for name, arrays in bad.items():
        files[name] = folder / f"{name}.npz"
        np.savez(files[name], **arrays)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    files["x.npy"], files["y.npy"] = folder / "x.npy", folder / "y.npy"
    (folder / "junk.pt").write_text("not a checkpoint")
    files["junk.pt"] = folder / "junk.pt"
    return files


BAD = [
    ("missing_key", [], r"missing_key\.npz: missing array 'x'; the file holds \[inputs, y\]"),
    ("wrong_dtype", [], r"wrong_dtype\.npz: x must be float32 of shape \[-1, 4\] .*got float64 of shape \[60, 4\]"),
    ("wrong_shape", [], r"wrong_shape\.npz: x must be float32 of shape \[-1, 4\] .*got float32 of shape \[60, 5\]"),
    ("target_dtype", [], r"target_dtype\.npz: y must be int64 of shape \[-1\]"),
    ("empty", [], r"empty\.npz: the dataset is empty \(0 samples\)"),
    ("nan", [], r"nan\.npz: x holds NaN or infinite values"),
    ("good", ["--batch-size", "0"], r"batch size must be in 1\.\.60, got 0"),
    ("good", ["--batch-size", "61"], r"batch size must be in 1\.\.60, got 61"),
    ("good", ["--mode", "turbo"], r"unknown mode 'turbo'; expected full, step or fused"),
]


@pytest.mark.parametrize("name, extra, message", BAD, ids=[f"{b[0]}{''.join(b[1])}" for b in BAD])
def test_bad_input_is_one_line_and_writes_nothing(models, data, tmp_path, name, extra, message):
    history, checkpoint = tmp_path / "h.jsonl", tmp_path / "c.pt"
    result = _train("--model", models["mlp_classifier.pt"], "--data", data[name], "--epochs", 2,
                    "--history", history, "--checkpoint", checkpoint, *extra)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    assert re.search(message, errors[0]), errors[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("outputs", ["history_is_data", "checkpoint_is_val", "history_is_checkpoint", "values_are_checkpoint"])
def test_an_output_naming_an_input_or_another_output_is_refused_and_nothing_is_touched(models, data, tmp_path, outputs):
    train, val = tmp_path / "train.npz", tmp_path / "val.npz"
    train.write_bytes(data["good"].read_bytes())
    val.write_bytes(data["val"].read_bytes())
    files = {"history_is_data": ("--history", train, "--checkpoint", tmp_path / "c.pt"),
             "checkpoint_is_val": ("--history", tmp_path / "h.jsonl", "--checkpoint", val),
             "history_is_checkpoint": ("--history", tmp_path / "run", "--checkpoint", tmp_path / "run"),
             # the history's values file (h.jsonl.values) would be the checkpoint
             "values_are_checkpoint": ("--history", tmp_path / "t", "--checkpoint", tmp_path / "t.values")}[outputs]
    before = {p: p.read_bytes() for p in (train, val)}
    result = _train("--model", models["mlp_classifier.pt"], "--data", train, "--val", val, "--epochs", 1, *files)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr
    assert "is the same file as" in errors[0] and "give another file" in errors[0], errors[0]
    assert {p: p.read_bytes() for p in (train, val)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.npz", "val.npz"]


def test_unreadable_checkpoint_is_one_line(data, tmp_path):
    result = _train("--resume", data["junk.pt"], "--data", data["good"], "--history", tmp_path / "h.jsonl")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {data['junk.pt']} is not a TorchScript file")
    assert list(tmp_path.iterdir()) == []


def test_cli_equals_reference_and_resumes(jvm, models, data, tmp_path):
    model = models["mlp_classifier.pt"]
    checkpoint = tmp_path / "run.pt"
    common = ["--data", data["good"], "--val", data["val"], "--batch-size", 16, "--seed", 4, "--mode", "fused"]
    first = _train("--model", model, *common, "--epochs", 2, "--history", tmp_path / "a.jsonl", "--checkpoint", checkpoint)
    assert first.returncode == 0, first.stderr
    assert "epoch 1: loss" in first.stdout
    second = _train("--resume", checkpoint, *common, "--epochs", 3, "--history", tmp_path / "b.jsonl")
    assert second.returncode == 0, second.stderr
    cli = History(History.load(tmp_path / "a.jsonl").records + History.load(tmp_path / "b.jsonl").records)
    x, y = np.load(data["good"])["x"], np.load(data["good"])["y"]
    val = (np.load(data["val"])["x"], np.load(data["val"])["y"])
    python = reference.train(model, x, y, epochs=5, batch_size=16, seed=4, mode="fused", val=val)
    report = compare_histories(python, cli, rtol=RTOL, atol=ATOL, labels=("python", "cli"))
    assert report.within_tolerance, report.table()
    assert protocol.read_metadata(checkpoint)["checkpoint"]["epochs_completed"] == 2


def test_npy_pair_input(models, data, tmp_path):
    result = _train("--model", models["mlp_classifier.pt"], "--x", data["x.npy"], "--y", data["y.npy"], "--epochs", 1)
    assert result.returncode == 0, result.stderr


@pytest.mark.gradle
def test_gradle_train_task(models, data, tmp_path):
    history = tmp_path / "gradle train.jsonl"
    result = run_task("train", ["--model", models["mlp_classifier.pt"],
                                "--data", data["good"], "--epochs", 2, "--batch-size", 20, "--mode", "step",
                                "--history", history])
    assert result.returncode == 0, result.stderr
    x, y = np.load(data["good"])["x"], np.load(data["good"])["y"]
    python = reference.train(models["mlp_classifier.pt"], x, y, epochs=2, batch_size=20, mode="step")
    assert compare_histories(python, History.load(history), rtol=RTOL, atol=ATOL).within_tolerance
