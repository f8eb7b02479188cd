"""The `gradbridge` command line, run as a user would (a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gradbridge import protocol

REPO_ROOT = Path(__file__).resolve().parents[1]


def _gradbridge(*args):
    # From the repository root, so that MODULE:FACTORY can name tests.models.custom.
    return subprocess.run([sys.executable, "-m", "gradbridge", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO_ROOT)


def test_export_writes_a_training_module(tmp_path):
    out = tmp_path / "lr.pt"
    result = _gradbridge("export", "linear-regression", "-o", out, "--seed", 3)
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    assert protocol.read_metadata(out)["model"] == "linear-regression"


def test_bad_learning_rate_is_one_line_and_nothing_written(tmp_path):
    out = tmp_path / "lr.pt"
    result = _gradbridge("export", "linear-regression", "-o", out, "--lr", "-1")
    assert result.returncode == 1
    assert result.stderr.strip() == "gradbridge: error: Invalid learning rate: -1.0"
    assert not out.exists()


def test_export_module_factory_with_options(tmp_path):
    out = tmp_path / "reg.pt"
    result = _gradbridge("export", "tests.models.custom:two_layer_regressor", "-o", out, "--input-shape", "3",
                         "--loss", "huber", "--delta", "0.5", "--optimizer", "adam", "--lr", "0.002",
                         "--betas", "0.8", "0.99", "--amsgrad")
    assert result.returncode == 0, result.stderr
    metadata = protocol.read_metadata(out)
    assert metadata["model"] == "tests.models.custom:two_layer_regressor"
    assert metadata["loss"] == {"name": "huber", "reduction": "mean", "delta": 0.5}
    assert metadata["optimizer"]["betas"] == [0.8, 0.99] and metadata["optimizer"]["amsgrad"] is True
    assert metadata["inputs"][0]["shape"] == [-1, 3]


def test_export_autocast_records_what_the_python_api_records(tmp_path):
    """``--autocast bfloat16`` is the Python API's ``autocast=torch.bfloat16``: the same ``capture`` metadata;
    a dtype it does not take is argparse's one line, nothing written."""
    import torch

    from gradbridge.export import export_builtin

    out = tmp_path / "cli.pt"
    result = _gradbridge("export", "mlp", "-o", out, "--input-shape", "4", "--loss", "cross_entropy",
                         "--autocast", "bfloat16")
    assert result.returncode == 0, result.stderr
    api = export_builtin("mlp", tmp_path / "api.pt", loss={"name": "cross_entropy"},
                         inputs=[protocol.tensor_spec("x", [-1, 4], "float32"), protocol.tensor_spec("y", [-1], "int64")],
                         in_features=4, fine_tuning={"autocast": torch.bfloat16})
    capture = protocol.read_metadata(out)[protocol.CAPTURE_KEY]
    assert capture[protocol.AUTOCAST_KEY] == "bfloat16"
    assert capture == protocol.read_metadata(api)[protocol.CAPTURE_KEY]
    refused = _gradbridge("export", "mlp", "-o", tmp_path / "no.pt", "--input-shape", "4", "--autocast", "float32")
    assert refused.returncode != 0
    (line,) = refused.stderr.strip().splitlines()
    assert "argument --autocast: invalid choice: 'float32'" in line, line
    assert not (tmp_path / "no.pt").exists()


def test_export_unscriptable_factory_is_traced_from_the_cli(tmp_path):
    out = tmp_path / "u.pt"
    result = _gradbridge("export", "tests.models.custom:unscriptable", "-o", out, "--input-shape", "4",
                         "--loss", "cross_entropy", "--optimizer", "sgd", "--lr", "0.1")
    assert result.returncode == 0, result.stderr
    assert "tracing it on example_inputs instead" in result.stderr


def test_option_that_the_optimizer_lacks_is_one_line(tmp_path):
    result = _gradbridge("export", "mlp", "-o", tmp_path / "m.pt", "--input-shape", "4", "--loss", "cross_entropy",
                         "--optimizer", "adam", "--momentum", "0.9")
    assert result.returncode == 1
    assert result.stderr.strip().startswith("gradbridge: error: optimizer adam:")
    assert "momentum" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_unknown_factory_module_is_one_line(tmp_path):
    result = _gradbridge("export", "nowhere:factory", "-o", tmp_path / "m.pt")
    assert result.returncode == 1
    assert "cannot import nowhere" in result.stderr
