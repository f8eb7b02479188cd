"""`gradbridge bench --quick` runs end to end once (timings are reported, never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gradbridge.commands.bench import IN_PROCESS, VARIANTS
from gradbridge._devtree import root

REPO_ROOT = root()


@pytest.mark.gradle
def test_quick_benchmark_writes_table_json_and_chart(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gradbridge", "bench", "--quick", "--out-dir", tmp_path],
                            capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "time per training step" in result.stdout and "targets" in result.stdout
    document = json.loads((tmp_path / "bench.json").read_text())
    assert len(document["steps"]) == 3
    for case in document["steps"]:
        assert set(case["variants"]) == set(VARIANTS) | set(IN_PROCESS)
        assert all(v["median_s"] > 0 and v["min_s"] <= v["median_s"] for v in case["variants"].values())
    assert document["transfer"]["gb_per_s"]["numpy copy (allocates, like a new tensor)"] > 0
    assert len(document["memory"]["samples"]) > 2
    assert {"import torch", "JVM + DJL engine", "first module load"} <= set(document["startup"])
    assert all("met" in target for target in document["targets"])
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "native" / "train_loop").exists()
