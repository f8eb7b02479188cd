"""`gradbridge parity` on a model written only for this check, its reports, and its bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from gradbridge import EpochRecord, History
from gradbridge.commands import parity as paritycheck
from gradbridge.parity import assert_histories_match, compare_histories
from gradbridge._runtime.devtree import root

REPO_ROOT = root()


def _gradbridge(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gradbridge", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO_ROOT, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def custom(tmp_path_factory):
    """tests.models.custom:two_layer_regressor, exported as the README shows, with its data."""
    folder = tmp_path_factory.mktemp("custom")
    result = _gradbridge("export", "tests.models.custom:two_layer_regressor", "-o", folder / "regressor.pt",
                         "--input-shape", "3", "--loss", "smooth_l1", "--optimizer", "adam", "--lr", "0.01")
    assert result.returncode == 0, result.stderr
    g = np.random.default_rng(0)
    for name, n in (("train", 64), ("val", 16)):
        x = g.standard_normal((n, 3)).astype(np.float32)
        np.savez(folder / f"{name}.npz", x=x, y=(x @ [[1.0], [-2.0], [0.5]]).astype(np.float32))
    return folder


def test_parity_on_a_custom_model_with_report_and_plot(custom, tmp_path):
    report, plot = tmp_path / "report.json", tmp_path / "parity.png"
    result = _gradbridge("parity", custom / "regressor.pt", "--data", custom / "train.npz", "--val", custom / "val.npz",
                         "--epochs", 5, "--batch-size", 8, "--seed", 3, "--mode", "fused", "--java", "both",
                         "--report", report, "--plot", plot)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "java: bitwise identical over 5 epochs" in result.stdout
    assert "java-subprocess: " in result.stdout
    document = json.loads(report.read_text())
    assert document["config"]["epochs"] == 5 and len(document["comparisons"]) == 2
    inprocess = document["comparisons"][0]
    assert inprocess["bitwise"] and inprocess["rtol"] == 0 and len(inprocess["epochs"]) == 5
    assert inprocess["epochs"][0]["val_loss_a"] == inprocess["epochs"][0]["val_loss_b"]
    assert document["comparisons"][1]["within_tolerance"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 20_000


def test_a_divergence_is_reported_with_epoch_parameter_and_values(jvm, custom, monkeypatch):
    real_train = paritycheck.java.train

    def perturbed(*args, **kwargs):  # a Java run that drifts from epoch 2 on
        history = real_train(*args, **kwargs)
        for record in history.records[2:]:
            record.parameters["0.weight"] = record.parameters["0.weight"] + 1e-3
        return history

    monkeypatch.setattr(paritycheck.java, "train", perturbed)
    lines = []
    code = paritycheck.run(custom / "regressor.pt", custom / "train.npz", epochs=4, batch_size=16, atol=1e-4,
                           out=lines.append)
    text = "\n".join(lines)
    assert code == 1
    assert "java: diverged at epoch 2 (rtol=0, atol=0.0001)" in text
    assert "parameter 0.weight[" in text and "|difference| 1.000e-03" in text


@pytest.mark.parametrize("case, env, message", [
    ("no_protocol", {}, r"no_protocol\.pt: TorchScript archive without gradbridge\.json"),
    ("bad_data", {}, r"x must be float32 of shape \[-1, 3\] .*got float32 of shape \[10, 2\]"),
    ("no_java_build", {"GRADBRIDGE_CLASSPATH": "/nonexistent/gradbridge.jar"}, r"names files that do not exist: /nonexistent/gradbridge\.jar; correct or unset GRADBRIDGE_CLASSPATH"),
    ("jvm_missing", {"GRADBRIDGE_JVM": "/nonexistent/libjvm.so"}, r"GRADBRIDGE_JVM=/nonexistent/libjvm\.so: no such file"),
])
def test_bad_input_is_one_line(custom, models, tmp_path, case, env, message):
    model = models["no_protocol.pt"] if case == "no_protocol" else custom / "regressor.pt"
    data = custom / "train.npz"
    if case == "bad_data":
        data = tmp_path / "bad.npz"
        np.savez(data, x=np.zeros((10, 2), np.float32), y=np.zeros((10, 1), np.float32))
    result = _gradbridge("parity", model, "--data", data, "--epochs", 1, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert re.search(message, lines[0]) and lines[0].startswith("gradbridge: error: "), lines[0]


def test_a_torchscript_traceback_is_cut_to_its_error_line(tmp_path):
    """An id outside an embedding fails inside the scripted forward, whose TorchScript error text is a
    traceback of ~2,000 characters of code excerpts before its last line: parity's line names the data
    (data.out_of_range); any other such failure keeps the traceback's last line only."""
    from gradbridge import messages, recommender

    model = recommender.export(tmp_path / "rec.pt", users=5, items=4, dim=2, lr=0.05)
    data = tmp_path / "ids.npz"
    x = np.zeros((10, 2), np.int64)
    x[3, 1] = 9  # item 9 of 4
    np.savez(data, x=x, y=np.zeros((10, 1), np.float32))
    result = _gradbridge("parity", model, "--data", data, "--epochs", 1, "--batch-size", 5)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0] == (f"gradbridge: error: {data}: x holds 9 at element [1] of a row, outside the range the "
                        "model takes there (0..3)"), lines[0]
    # the rule itself: the last error line of the traceback, and never more than TORCH_REASON_LIMIT characters
    traceback = (f"{messages.TORCHSCRIPT_TRACEBACK}.\nTraceback of TorchScript (most recent call last):\n"
                 + "  File \"code/x.py\", line 3, in train_step\n    loss = self.loss(y_hat, y)\n" * 40)
    assert messages.torch_reason(RuntimeError(traceback + "RuntimeError: Target 7 is out of bounds.\n")) == (
        "RuntimeError: Target 7 is out of bounds.")
    long = messages.torch_reason(RuntimeError(traceback + "ValueError: " + "x" * 5000))
    assert len(long) == messages.TORCH_REASON_LIMIT + 3 and long.startswith("ValueError: xxx") and long.endswith("...")


def _history(values):
    return History([EpochRecord(i, 1.0, {"w": np.array(v, dtype=np.float64)}) for i, v in enumerate(values)])


def test_assert_histories_match_names_epoch_parameter_values_and_difference():
    python = _history([[1.0, 2.0], [1.5, 2.5], [2.0, 3.0]])
    java = _history([[1.0, 2.0], [1.5, 2.5000001], [2.0, 3.1]])
    assert_histories_match(History(python.records[:2]), History(java.records[:2]), atol=1e-6)  # within atol
    with pytest.raises(AssertionError) as info:
        assert_histories_match(python, java, atol=1e-6)
    assert str(info.value) == (
        "diverged at epoch 2 (rtol=0, atol=1e-06): loss 1.0 (python) vs 1.0 (java), |difference| 0.000e+00; "
        "parameter w[1] = 3.0 (python) vs 3.1 (java), |difference| 1.000e-01")
    assert not compare_histories(python, java).bitwise


def test_plugin_fixtures_work_in_a_fresh_pytest(pytester, models):
    pytester.makepyfile(test_user=f'''
        import numpy as np
        from gradbridge import reference
        from gradbridge.pytest_plugin import assert_histories_match

        MODEL = {str(models["mlp_classifier.pt"])!r}

        def test_java_matches_python(gradbridge_jvm, java_trainer):
            g = np.random.default_rng(1)
            x = g.standard_normal((40, 4)).astype(np.float32)
            y = (x[:, 0] > 0).astype(np.int64)
            assert_histories_match(reference.train(MODEL, x, y, epochs=2, batch_size=8),
                                   java_trainer(MODEL, x, y, epochs=2, batch_size=8))
    ''')
    result = pytester.runpytest_subprocess("-p", "no:faulthandler", "-q")
    result.assert_outcomes(passed=1)
