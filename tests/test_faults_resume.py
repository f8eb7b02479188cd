"""Fault suite, surface "CLI arguments" for --resume: the checkpoint records what the run depends on.

Before, a checkpoint held the epoch count and seed only: --resume without the original
--batch-size silently went on with the default, other data was accepted, and an absurd epoch
count "resumed" (and printed a checkpoint path that was never written).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradbridge import protocol
from tests.faults import one_error_line, rewrite_metadata, stray_files, train_cli


def _classification(n, seed=0):
    g = np.random.default_rng(seed)
    x = g.standard_normal((n, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)


@pytest.fixture(scope="module")
def run(models, tmp_path_factory):
    """Two epochs of a fused run (batch 16, seed 4) with a checkpoint, and a five-epoch run to compare."""
    folder = tmp_path_factory.mktemp("resume")
    data, other = folder / "data.npz", folder / "other.npz"
    x, y = _classification(60)
    np.savez(data, x=x, y=y)
    x2 = x.copy()
    x2[7, 2] += 1.0  # one value differs
    np.savez(other, x=x2, y=y)
    settings = ["--batch-size", 16, "--mode", "fused", "--seed", 4]
    model = models["mlp_classifier.pt"]
    first = train_cli("--model", model, "--data", data, *settings, "--epochs", 2, "--checkpoint", folder / "c.pt")
    assert first.returncode == 0, first.stderr
    whole = train_cli("--model", model, "--data", data, *settings, "--epochs", 5, "--history", folder / "whole.jsonl")
    assert whole.returncode == 0, whole.stderr
    return {"folder": folder, "data": data, "other": other, "checkpoint": folder / "c.pt",
            "whole": folder / "whole.jsonl"}


def _records(path):
    return [(r["epoch"], r["loss"], r["digests"]) for r in map(json.loads, path.read_text().splitlines())]


def test_checkpoint_records_the_run(run):
    saved = protocol.read_metadata(run["checkpoint"])["checkpoint"]
    assert saved["epochs_completed"] == 2 and saved["seed"] == 4
    assert saved["batch_size"] == 16 and saved["mode"] == "fused"
    assert saved["x_shape"] == [60, 4] and saved["y_shape"] == [60] and len(saved["data_sha256"]) == 64


def test_resume_uses_the_checkpoint_settings(run, tmp_path):
    result = train_cli("--resume", run["checkpoint"], "--data", run["data"], "--epochs", 3,
                       "--history", tmp_path / "rest.jsonl")
    assert result.returncode == 0, result.stderr
    assert _records(tmp_path / "rest.jsonl") == _records(run["whole"])[2:]


@pytest.mark.parametrize("option, value, message", [
    ("--batch-size", 8, "was trained with batch size 16; resume with the same batch size (or none) to continue the same run, not 8"),
    ("--mode", "step", "was trained with mode fused; resume with the same mode (or none) to continue the same run, not step"),
    ("--seed", 5, "was trained with seed 4; resume with the same seed (or none) to continue the same run, not 5"),
])
def test_conflicting_setting_is_refused(run, tmp_path, option, value, message):
    result = train_cli("--resume", run["checkpoint"], "--data", run["data"], option, value,
                       "--checkpoint", tmp_path / "next.pt", "--history", tmp_path / "h.jsonl")
    assert one_error_line(result) == f"{run['checkpoint']} {message}"
    assert stray_files(tmp_path) == []


def test_different_data_is_refused_unless_allowed(run, tmp_path):
    result = train_cli("--resume", run["checkpoint"], "--data", run["other"], "--checkpoint", tmp_path / "next.pt")
    line = one_error_line(result)
    assert line.startswith(f"{run['other']}: not the data {run['checkpoint']} was trained on: expected x [60, 4] y [60]")
    assert line.endswith("; pass --allow-different-data to continue on it anyway")
    assert stray_files(tmp_path) == []
    allowed = train_cli("--resume", run["checkpoint"], "--data", run["other"], "--allow-different-data",
                        "--checkpoint", tmp_path / "next.pt")
    assert allowed.returncode == 0, allowed.stderr
    assert protocol.read_metadata(tmp_path / "next.pt")["checkpoint"]["epochs_completed"] == 3


@pytest.mark.parametrize("completed", [2147483647, -5])
def test_absurd_epoch_count_is_refused(run, tmp_path, completed):
    def edit(document):
        document["checkpoint"]["epochs_completed"] = completed
        return document

    crafted = rewrite_metadata(run["checkpoint"], tmp_path / "crafted.pt", edit)
    result = train_cli("--resume", crafted, "--data", run["data"], "--checkpoint", tmp_path / "next.pt")
    assert one_error_line(result) == f"{crafted}: epochs_completed {completed} + epochs 1 must be in 0..2147483647"
    assert "checkpoint:" not in result.stdout
    assert stray_files(tmp_path) == ["crafted.pt"]


def test_huge_epochs_argument_is_refused(run, tmp_path):
    result = train_cli("--resume", run["checkpoint"], "--data", run["data"], "--epochs", 2147483647)
    assert one_error_line(result) == f"{run['checkpoint']}: epochs_completed 2 + epochs 2147483647 must be in 0..2147483647"


def _without(key):
    def edit(document):
        if key == "checkpoint":
            del document["checkpoint"]
        else:
            del document["checkpoint"][key]
        return document

    return edit


@pytest.mark.parametrize("removed, expected", [
    ("checkpoint", 'not a checkpoint to resume: its gradbridge.json has no "checkpoint" entry (an exported module, '
                   "or an edited checkpoint); resume from a file that --checkpoint wrote, or start a new run with "
                   "--model {crafted}"),
    ("epochs_completed", 'its "checkpoint" entry has no "epochs_completed" key, which a resume needs to continue the '
                         "run where it stopped; resume from a file that --checkpoint wrote, or start a new run with "
                         "--model {crafted}"),
    ("batch_size", 'its "checkpoint" entry has no "batch_size" key, which a resume needs to continue the run where it '
                   "stopped; resume from a file that --checkpoint wrote, or start a new run with --model {crafted}"),
    ("data_sha256", 'its "checkpoint" entry has no "data_sha256" key, which a resume needs to check that it continues '
                    "on the data the run was trained on; resume from a file that --checkpoint wrote, or pass "
                    "--allow-different-data to continue on any data"),
    ("x_shape", 'its "checkpoint" entry has no "x_shape" key, which a resume needs to check that it continues '
                "on the data the run was trained on; resume from a file that --checkpoint wrote, or pass "
                "--allow-different-data to continue on any data"),
])
def test_an_edited_checkpoint_without_what_a_resume_needs_is_refused(run, tmp_path, removed, expected):
    """Before, a file without its checkpoint entry silently started the run over, and one without
    data_sha256 skipped the same-data check (other data resumed, exit 0)."""
    crafted = rewrite_metadata(run["checkpoint"], tmp_path / "crafted.pt", _without(removed))
    result = train_cli("--resume", crafted, "--data", run["other"], "--checkpoint", tmp_path / "next.pt",
                       "--history", tmp_path / "h.jsonl")
    assert one_error_line(result) == f"{crafted}: " + expected.format(crafted=crafted)
    assert "epoch" not in result.stdout
    assert stray_files(tmp_path) == ["crafted.pt"]


def test_allowing_other_data_waives_only_the_data_keys(run, tmp_path):
    crafted = rewrite_metadata(run["checkpoint"], tmp_path / "crafted.pt", _without("data_sha256"))
    allowed = train_cli("--resume", crafted, "--data", run["other"], "--allow-different-data",
                        "--checkpoint", tmp_path / "next.pt")
    assert allowed.returncode == 0, allowed.stderr
    assert protocol.read_metadata(tmp_path / "next.pt")["checkpoint"]["epochs_completed"] == 3
    # a checkpoint edited to start over is refused all the same
    started = rewrite_metadata(run["checkpoint"], tmp_path / "started.pt", _without("seed"))
    result = train_cli("--resume", started, "--data", run["other"], "--allow-different-data")
    assert one_error_line(result).startswith(f'{started}: its "checkpoint" entry has no "seed" key')
