"""The `gradbridge` command line, run as a user would (a subprocess)."""

from __future__ import annotations

import subprocess
import sys

from gradbridge import protocol


def _gradbridge(*args):
    return subprocess.run([sys.executable, "-m", "gradbridge", *map(str, args)], capture_output=True, text=True)


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
