"""Fault suite, surface "disk": unwritable paths are refused before training, a full disk names the
file, and files are written with the user's umask (an existing file keeps its permissions).

Before, an unwritable --checkpoint/--history was found only after the first (or last) epoch and
the error named the temp file; a full disk named no file; every file came out 0600.
"""

from __future__ import annotations

import os
import stat
import subprocess

import numpy as np
import pytest

from gradbridge import protocol
from tests.faults import one_error_line, stray_files, train_cli


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("disk-data") / "data.npz"
    g = np.random.default_rng(0)
    x = g.standard_normal((40, 4)).astype(np.float32)
    np.savez(path, x=x, y=(x[:, 0] > 0).astype(np.int64))
    return path


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("option", ["--checkpoint", "--history"])
def test_path_under_a_file_is_refused_before_training(models, data, tmp_path, option):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / "out" / "x.pt"
    result = train_cli("--model", models["mlp_classifier.pt"], "--data", data, "--epochs", 3, option, target)
    assert one_error_line(result) == f"cannot write {target}: {blocker} is not a directory"
    assert "epoch 0" not in result.stdout  # refused before any training
    assert stray_files(tmp_path) == ["a-file"]


def test_directory_as_history_is_refused_before_training(models, data, tmp_path):
    folder = tmp_path / "history-folder"
    folder.mkdir()
    result = train_cli("--model", models["mlp_classifier.pt"], "--data", data, "--epochs", 3,
                       "--checkpoint", tmp_path / "c.pt", "--history", folder)
    assert one_error_line(result) == f"cannot write {folder}: it is a directory"
    assert stray_files(tmp_path) == ["history-folder"]


@pytest.fixture
def full_disk(tmp_path):
    """A 4 KiB tmpfs (needs root, as on the CI machines; skipped elsewhere)."""
    mount_point = tmp_path / "full"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mount_point)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_full_disk_names_the_file(models, data, full_disk):
    checkpoint = full_disk / "c.pt"
    result = train_cli("--model", models["mlp_classifier.pt"], "--data", data, "--epochs", 2,
                       "--checkpoint", checkpoint)
    assert one_error_line(result) == f"cannot write {checkpoint}: No space left on device"
    assert stray_files(full_disk) == []


def _run_with_umask(mask, *args):
    return train_cli(*args, preexec_fn=lambda: os.umask(mask))


def test_new_files_follow_the_umask(models, data, tmp_path):
    checkpoint, history = tmp_path / "c.pt", tmp_path / "h.jsonl"
    result = _run_with_umask(0o027, "--model", models["mlp_classifier.pt"], "--data", data,
                             "--checkpoint", checkpoint, "--history", history)
    assert result.returncode == 0, result.stderr
    assert (_mode(checkpoint), _mode(history)) == (0o640, 0o640)


def test_existing_file_keeps_its_permissions(models, data, tmp_path):
    checkpoint = tmp_path / "c.pt"
    first = _run_with_umask(0o022, "--model", models["mlp_classifier.pt"], "--data", data, "--checkpoint", checkpoint)
    assert first.returncode == 0, first.stderr
    assert _mode(checkpoint) == 0o644
    again = _run_with_umask(0o077, "--resume", checkpoint, "--data", data, "--checkpoint", checkpoint)
    assert again.returncode == 0, again.stderr
    assert _mode(checkpoint) == 0o644
    assert protocol.read_metadata(checkpoint)["checkpoint"]["epochs_completed"] == 2


# ---- memory: a JVM that runs out is one line naming what to change ----

@pytest.fixture(scope="module")
def mid_size(tmp_path_factory):
    """A 2.25-million-parameter model: its history values (18 MB as float64) cannot fit a 16 MB JVM."""
    import torch

    from gradbridge import export_training_module

    folder = tmp_path_factory.mktemp("mid-size")
    g = np.random.default_rng(0)
    x, y = g.standard_normal((8, 1500)).astype(np.float32), g.integers(0, 1500, 8).astype(np.int64)
    np.savez(folder / "data.npz", x=x, y=y)
    torch.manual_seed(0)
    return export_training_module(torch.nn.Linear(1500, 1500), "cross_entropy", {"name": "sgd", "lr": 0.1},
                                  folder / "mid.pt", example_inputs=(torch.from_numpy(x), torch.from_numpy(y)),
                                  format="torchscript", check=False), folder / "data.npz"


def test_out_of_memory_is_one_line_naming_what_to_change(mid_size, tmp_path):
    model, data = mid_size
    small = dict(os.environ, JAVA_OPTS="-Xmx16m")
    outputs = ["--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt"]
    result = train_cli("--model", model, "--data", data, "--batch-size", 8, *outputs, env=small)
    line = one_error_line(result)
    assert line.startswith("gradbridge-train ran out of Java memory (") and "JAVA_OPTS=-Xmx" in line \
        and "--digests-only" in line, line
    assert stray_files(tmp_path) == []
    # what the line says to change works in the same 16 MB: digests only, the checkpoint written tensor by tensor
    again = train_cli("--model", model, "--data", data, "--batch-size", 8, *outputs, "--digests-only", env=small)
    assert again.returncode == 0, again.stderr
    assert stray_files(tmp_path) == ["c.pt", "h.jsonl"]
