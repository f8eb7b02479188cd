"""Fault suite, surface "module files": whatever is passed as the module, both CLIs and the Python
API answer with one line (or the documented exception) naming the file; the seed example too.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradbridge import ModuleLoadError, ProtocolError
from gradbridge._devtree import root
from gradbridge.jvm import load_module

REPO_ROOT = root()
from tests.faults import gradbridge_cli, one_error_line, stray_files, train_cli

SEED_SCRIPT = REPO_ROOT / "build" / "install" / "gradbridge" / "bin" / "gradbridge"


@pytest.fixture(scope="module")
def files(models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-modules")
    good = models["linear_regression.pt"].read_bytes()
    truncated = folder / "truncated.pt"
    truncated.write_bytes(good[: len(good) // 2])
    empty = folder / "empty.pt"
    empty.write_bytes(b"")
    directory = folder / "folder.pt"
    directory.mkdir()
    data = folder / "data.npz"
    x = np.linspace(0, 1, 10, dtype=np.float32).reshape(10, 1)
    np.savez(data, x=x, y=x)
    return {"missing": folder / "absent.pt", "truncated": truncated, "empty": empty, "folder": directory,
            "text": models["not_torchscript.pt"], "no_protocol": models["no_protocol.pt"],
            "missing_methods": models["missing_methods.pt"], "data": data}


# name -> (Python exception of jvm.load_module, words the line must hold)
CASES = {
    "missing": (ModuleLoadError, "(file not found)"),
    "folder": (ModuleLoadError, "(file not found)"),
    "truncated": (ModuleLoadError, "is not a TorchScript file (not a zip archive)"),
    "empty": (ModuleLoadError, "is not a TorchScript file (not a zip archive)"),
    "text": (ModuleLoadError, "is not a TorchScript file (not a zip archive)"),
    "no_protocol": (ProtocolError, "is a TorchScript module without gradbridge.json"),
    "missing_methods": (ProtocolError, "lacks protocol methods"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_train_cli(files, tmp_path, name):
    line = one_error_line(train_cli("--model", files[name], "--data", files["data"], "--history", tmp_path / "h.jsonl",
                                    "--checkpoint", tmp_path / "c.pt"))
    assert str(files[name]) in line and CASES[name][1] in line, line
    assert stray_files(tmp_path) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_in_process(jvm, files, name):
    error, words = CASES[name]
    with pytest.raises(error) as info:
        load_module(files[name])
    assert str(files[name]) in str(info.value) and words in str(info.value)


@pytest.mark.parametrize("name", ["missing", "truncated", "text", "no_protocol"])
def test_parity_cli(files, name):
    line = one_error_line(gradbridge_cli("parity", files[name], "--data", files["data"], "--epochs", 1),
                          prefix="gradbridge: error: ")
    assert line.startswith(f"{files[name]}: ") or str(files[name]) in line, line


@pytest.mark.parametrize("args", [["--model", "MISSING"], ["--model", "GOOD", "--lr", "abc"],
                                  ["--model", "GOOD", "--epochs", "0"]])
def test_seed_example(files, models, args):
    args = [str(files["missing"]) if a == "MISSING" else str(models["linear_regression.pt"]) if a == "GOOD" else a
            for a in args]
    import subprocess

    line = one_error_line(subprocess.run([str(SEED_SCRIPT), *args], capture_output=True, text=True))
    assert line, line
