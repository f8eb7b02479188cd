"""Fault suite, surface "native library": the pairing of libtorch and gradbridge's native library.

A libtorch folder that is not one, a native library built for another libtorch, a missing
compiler: one line each naming what is wrong, exit 1, nothing written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from gradbridge import native
from gradbridge.errors import SetupError
from tests.faults import one_error_line, stray_files, train_cli

REPO_ROOT = Path(__file__).resolve().parents[1]
JAR_LIBRARY = REPO_ROOT / "build" / "native-resources" / native.JAR_FOLDER


@pytest.fixture
def data(tmp_path):
    x = np.arange(8, dtype=np.float32).reshape(8, 1)
    path = tmp_path / "data.npz"
    np.savez(path, x=x, y=2 * x)
    return path


def _train(models, data, tmp_path, **env):
    return train_cli("--model", models["linear_regression.pt"], "--data", data, "--epochs", 1,
                     "--history", tmp_path / "h.jsonl", env={**os.environ, **env})


def test_a_libtorch_folder_that_is_not_one(models, data, tmp_path):
    folder = tmp_path / "not-libtorch"
    folder.mkdir()
    result = _train(models, data, tmp_path, GRADBRIDGE_LIBTORCH=str(folder))
    assert one_error_line(result) == (
        f"{folder} (GRADBRIDGE_LIBTORCH) is not a libtorch folder: it lacks libc10.so or libtorch_cpu.so; "
        "name a folder that holds them, e.g. a pip torch's torch/lib")
    assert stray_files(tmp_path, keep=("data.npz", "not-libtorch")) == []


def test_a_native_library_built_for_another_libtorch(models, data, tmp_path):
    built = next(JAR_LIBRARY.glob("libgradbridge_jni-torch*.so"))
    other = tmp_path / "libgradbridge_jni-torch2.15.0-cxx11abi1.so"
    shutil.copyfile(built, other)
    other.with_suffix(".properties").write_text("torch_version=2.15.0\ncxx11_abi=1\nsource_sha256=0\n")
    result = _train(models, data, tmp_path, GRADBRIDGE_NATIVE_LIBRARY=str(other))
    line = one_error_line(result)
    assert line.startswith(f"gradbridge's native library {other.name} was built for libtorch 2.15.0 (C++11 ABI 1), "
                           "but "), line
    assert " holds libtorch 2.7.1: use a native library built for 2.7.1 " in line, line
    assert stray_files(tmp_path, keep=("data.npz", other.name, other.with_suffix(".properties").name)) == []


def test_no_compiler_is_one_line_naming_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_prebuilt_folders", lambda: [])
    with pytest.raises(SetupError) as info:
        native.ensure(quiet=True)
    assert str(info.value) == (f"no C++ compiler to build gradbridge's native library for torch "
                               f"{native.torch_version()}: install g++ (e.g. apt-get install g++)")
    assert not (tmp_path / "cache").exists()
