"""`gradle run` (a separate JVM on the pytorch-native-cpu jar's libtorch) against the eager reference."""

from __future__ import annotations

import re

import pytest

from gradbridge import java
from gradbridge import History, compare_histories, reference
from gradbridge._runtime.gradle import run_task

EPOCHS = 100
LR = 0.01
# The pytorch-native-cpu jar's libtorch is a different build from pip's torch: its kernels may
# round differently in the last bits, so this comparison allows float32-level relative error
# (float32 epsilon is 1.2e-7; 100 epochs of compounding stay well inside 1e-5).
RTOL = 1e-5
ATOL = 1e-6

pytestmark = pytest.mark.gradle


@pytest.fixture(scope="module")
def gradle_run(model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("gradle run")  # a space in the path exercises -Pargs quoting
    history_file = out / "java history.jsonl"
    result = run_task("run", ["--model", model_path, "--epochs", EPOCHS, "--lr", LR, "--history", history_file])
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, History.load(history_file)


def test_gradle_run_prints_the_seed_log_with_falling_loss(gradle_run):
    stdout, _ = gradle_run
    lines = re.findall(r"Epoch \[\s*(\d+)\], Loss: ([\d.]+), Weight: ([-\d.]+), Bias: ([-\d.]+)", stdout)
    epochs = [int(e) for e, *_ in lines]
    assert epochs == [0, 20, 40, 60, 80, 99], stdout
    losses = [float(loss) for _, loss, *_ in lines]
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    assert re.search(r"Final parameters -> Weight: [-\d.]+, Bias: [-\d.]+", stdout)


def test_gradle_run_history_matches_eager_pytorch(jvm, model_path, gradle_run):
    _, from_gradle = gradle_run
    x, y = java.seed_data(seed=42, n=100)
    python = reference.train(model_path, x, y, epochs=EPOCHS, mode="full", lr=LR)
    report = compare_histories(python, from_gradle, rtol=RTOL, atol=ATOL, labels=("python", "gradle"))
    print(report.verdict())  # the measured bound, shown with -s or on failure
    assert report.within_tolerance, report.table(every=10)


def test_gradle_run_bad_model_is_one_clear_line(tmp_path):
    result = run_task("run", ["--model", tmp_path / "absent.pt", "--epochs", 1])
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "absent.pt" in errors[0] and "not found" in errors[0], result.stderr
