"""Fault suite, surface "CLI arguments": `gradbridge export` / `gradbridge parity` print one line,
never a traceback, for bad factories, bad labels and bad tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.faults import gradbridge_cli, one_error_line

PREFIX = "gradbridge: error: "


@pytest.fixture
def factories(tmp_path):
    (tmp_path / "badfactories.py").write_text(
        "import torch\n"
        "def raises():\n    raise RuntimeError('no weights here')\n"
        "def not_a_module():\n    return 42\n"
        "def fine():\n    return torch.nn.Linear(4, 3)\n")
    return tmp_path


def test_factory_that_raises(factories):
    result = gradbridge_cli("export", "badfactories:raises", "-o", factories / "m.pt", cwd=factories)
    assert one_error_line(result, PREFIX) == "model 'badfactories:raises': the factory raised RuntimeError: no weights here"
    assert not (factories / "m.pt").exists()


def test_factory_that_returns_no_module(factories):
    result = gradbridge_cli("export", "badfactories:not_a_module", "-o", factories / "m.pt", cwd=factories)
    assert one_error_line(result, PREFIX) == ("model 'badfactories:not_a_module': the factory must return a "
                                              "torch.nn.Module, got int")


def test_parity_with_labels_outside_the_classes(factories):
    model = factories / "m.pt"
    exported = gradbridge_cli("export", "badfactories:fine", "-o", model, "--input-shape", "4", "--loss",
                              "cross_entropy", cwd=factories)
    assert exported.returncode == 0, exported.stderr
    x = np.zeros((10, 4), np.float32)
    y = np.full(10, 7, np.int64)  # 3 classes
    np.savez(factories / "d.npz", x=x, y=y)
    result = gradbridge_cli("parity", model, "--data", factories / "d.npz", "--epochs", 1, "--batch-size", 5)
    line = one_error_line(result, PREFIX)
    assert line.startswith(f"{model}: training step failed at epoch 0: ") and "out of bounds" in line, line


@pytest.mark.parametrize("option, value", [("--rtol", "-1"), ("--atol", "nan"), ("--rtol", "inf")])
def test_negative_or_non_finite_tolerance_is_refused(model_path, tmp_path, option, value):
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 1), np.float32), y=np.zeros((4, 1), np.float32))
    result = gradbridge_cli("parity", model_path, "--data", tmp_path / "d.npz", option, value)
    assert one_error_line(result, PREFIX) == (f"argument {option}: invalid tolerance (a finite number >= 0) value: "
                                              f"'{value}' (see gradbridge parity --help)")


def test_paritycheck_run_refuses_a_negative_tolerance(model_path, tmp_path):
    from gradbridge.commands import parity as paritycheck

    with pytest.raises(ValueError, match=r"^rtol must be a finite number >= 0, got -1"):
        paritycheck.run(model_path, tmp_path / "unused.npz", rtol=-1)
