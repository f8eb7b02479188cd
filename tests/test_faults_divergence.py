"""Fault suite, a run that stops: divergence keeps every completed epoch (CLI, seed example, in-process).

Before, the epochs completed before a divergence were in neither the history file nor the output,
and the seed example (`--lr 1e6`) exited 0 with NaN parameters.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradbridge import DivergenceError, History, java, protocol, reference
from gradbridge._runtime.devtree import root

REPO_ROOT = root()
from tests.faults import one_error_line, stray_files, train_cli

SEED_SCRIPT = REPO_ROOT / "build" / "install" / "gradbridge" / "bin" / "gradbridge"


@pytest.fixture(scope="module")
def exploding(tmp_path_factory):
    """Inputs up to 100 with lr 0.01: each full-batch step multiplies the error, float32 overflows."""
    path = tmp_path_factory.mktemp("diverge") / "exploding.npz"
    x = np.linspace(0, 100, 50, dtype=np.float32).reshape(50, 1)
    np.savez(path, x=x, y=2 * x + 1)
    return path


def test_cli_divergence_keeps_every_completed_epoch(models, exploding, tmp_path):
    history, checkpoint = tmp_path / "h.jsonl", tmp_path / "c.pt"
    result = train_cli("--model", models["linear_regression.pt"], "--data", exploding, "--mode", "full",
                       "--epochs", 60, "--history", history, "--checkpoint", checkpoint)
    diverged, kept = _kept_until_divergence(result, history)
    assert all(np.isfinite(r.loss) for r in kept)
    assert [l for l in result.stdout.splitlines() if l.startswith("epoch ")][-1].startswith(f"epoch {diverged - 1}:")
    assert protocol.read_metadata(checkpoint)["checkpoint"]["epochs_completed"] == diverged
    assert stray_files(tmp_path) == ["c.pt", "h.jsonl"]


def test_seed_example_detects_divergence(models, tmp_path):
    history = tmp_path / "seed.jsonl"
    import subprocess

    result = subprocess.run([str(SEED_SCRIPT), "--model", models["linear_regression.pt"], "--lr", "1e6",
                             "--history", history], capture_output=True, text=True)
    line = one_error_line(result)
    # The seed example is the general Trainer (full-batch mode): its divergence line, plus the hint.
    assert line.startswith("loss is ") and line.endswith("; learning rate 1000000.0: try a smaller --lr"), line
    kept = [json.loads(l) for l in history.read_text().splitlines()]
    assert f"{len(kept)} completed epoch(s) kept in {history}" in line
    assert f"at epoch {len(kept)}, batch 0 (samples 0..99 of the epoch's order)" in line
    assert all(np.isfinite(r["loss"]) for r in kept)


def test_in_process_divergence_carries_the_completed_epochs(jvm, models, exploding):
    arrays = np.load(exploding)
    x, y = arrays["x"], arrays["y"]
    model = models["linear_regression.pt"]
    with pytest.raises(DivergenceError) as in_java:
        java.train(model, x, y, epochs=60, mode="full")
    with pytest.raises(DivergenceError) as in_python:
        reference.train(model, x, y, epochs=60, mode="full")
    assert len(in_java.value.history) > 2
    assert [r.loss for r in in_java.value.history] == [r.loss for r in in_python.value.history]
    # One wording on both sides, up to what each keeps (Java: files, Python: error.history)
    assert str(in_java.value).split("; training stopped")[0] == str(in_python.value).split("; training stopped")[0]


def test_spark_divergence_keeps_every_completed_epoch(models, exploding, tmp_path):
    """The Spark trainer's one barrier stage stops at the non-finite step; the epochs whose ends
    partition 0 handed to the driver are in the history and the checkpoint, equal to the replay."""
    from gradbridge._runtime import sparkrun

    history, checkpoint = tmp_path / "h.jsonl", tmp_path / "c.pt"
    result = sparkrun.run(["--master", "local[2]", "--model", models["linear_regression.pt"], "--data", exploding,
                           "--batch-size", 50, "--epochs", 60, "--history", history, "--checkpoint", checkpoint],
                          check=False)
    diverged, kept = _kept_until_divergence(result, history)
    replay = reference.train_sharded(models["linear_regression.pt"], *_arrays(exploding), epochs=diverged, shards=2,
                                     batch_size=50)
    assert [r.loss for r in kept] == [r.loss for r in replay]
    assert protocol.read_metadata(checkpoint)["checkpoint"]["epochs_completed"] == diverged
    assert stray_files(tmp_path) == ["c.pt", "h.jsonl"]


def _kept_until_divergence(result, history):
    """The divergence line's epoch, and the history's records: every epoch before it, named in the line."""
    line = one_error_line(result)
    diverged = int(line.split("at epoch ")[1].split(",")[0])
    assert diverged > 2, line
    assert f"{diverged} completed epoch(s) kept in {history}" in line
    kept = History.load(history)
    assert [r.epoch for r in kept] == list(range(diverged))
    return diverged, kept


def _arrays(npz):
    with np.load(npz) as data:
        return data["x"], data["y"]
