"""Fault suite, surface "signals": SIGTERM stops at a consistent point; SIGKILL during
checkpointing never tears the checkpoint, and the next run removes whatever temp file it left.

Before, every SIGKILL/SIGTERM during checkpointing could leave a .tmp and a .raw file beside the
checkpoint, never cleaned, and SIGTERM lost the history of the run.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
import zipfile

import numpy as np
import pytest

from gradbridge import protocol
from tests.faults import TRAIN_SCRIPT, stray_files, train_cli

EPOCHS = 300


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("signal-data") / "data.npz"
    g = np.random.default_rng(1)
    x = g.standard_normal((64, 4)).astype(np.float32)
    np.savez(path, x=x, y=(x[:, 0] > 0).astype(np.int64))
    return path


def _start(*args):
    return subprocess.Popen([str(TRAIN_SCRIPT), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait_for(path, process, timeout=60):
    deadline = time.time() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _records(path):
    return [(r["epoch"], r["loss"], r["digests"]) for r in map(json.loads, path.read_text().splitlines())]


def test_sigterm_stops_after_an_epoch_with_checkpoint_and_history(models, data, tmp_path):
    model = models["mlp_classifier.pt"]
    checkpoint, history = tmp_path / "c.pt", tmp_path / "h.jsonl"
    settings = ["--data", data, "--batch-size", 8, "--seed", 2]
    process = _start("--model", model, *settings, "--epochs", EPOCHS, "--checkpoint", checkpoint, "--history", history)
    _wait_for(history, process)
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Exception" not in err, err
    kept = _records(history)
    done = len(kept)
    assert 0 < done < EPOCHS
    assert errors[0] == f"error: SIGTERM received: stopped after epoch {done - 1}; resume with --resume {checkpoint}"
    assert [r[0] for r in kept] == list(range(done))
    assert protocol.read_metadata(checkpoint)["checkpoint"]["epochs_completed"] == done
    assert stray_files(tmp_path) == ["c.pt", "h.jsonl"]

    # The stopped run resumed equals the run never stopped.
    rest = train_cli("--resume", checkpoint, "--data", data, "--epochs", EPOCHS - done, "--history", tmp_path / "rest.jsonl")
    assert rest.returncode == 0, rest.stderr
    whole = train_cli("--model", model, *settings, "--epochs", EPOCHS, "--history", tmp_path / "whole.jsonl")
    assert whole.returncode == 0, whole.stderr
    assert kept + _records(tmp_path / "rest.jsonl") == _records(tmp_path / "whole.jsonl")


def test_sigkill_loop_leaves_only_checkpoint_and_history(models, data, tmp_path):
    checkpoint, history = tmp_path / "c.pt", tmp_path / "h.jsonl"
    rng = random.Random(7)
    leftovers_seen = 0
    source = ["--model", models["mlp_classifier.pt"]]
    for _ in range(8):
        process = _start(*source, "--data", data, "--epochs", EPOCHS, "--batch-size", 64,
                         "--checkpoint", checkpoint, "--history", history)
        _wait_for(history, process)
        time.sleep(rng.uniform(0.0, 0.4))
        process.kill()
        process.communicate()
        leftovers_seen += len(stray_files(tmp_path, keep=("c.pt", "h.jsonl")))
        # The checkpoint is whole after every kill: a valid archive with its metadata.
        with zipfile.ZipFile(checkpoint) as archive:
            assert archive.testzip() is None
        assert protocol.read_metadata(checkpoint)["checkpoint"]["epochs_completed"] >= 1
        source = ["--resume", checkpoint]
    print(f"leftovers seen during the SIGKILL loop: {leftovers_seen}")
    final = train_cli(*source, "--data", data, "--epochs", 1, "--checkpoint", checkpoint, "--history", history)
    assert final.returncode == 0, final.stderr
    assert stray_files(tmp_path) == ["c.pt", "h.jsonl"], f"{leftovers_seen} leftovers seen during the loop"
