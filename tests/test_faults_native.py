"""Fault suite, surface "native library": the pairing of libtorch and gradbridge's native library.

A libtorch folder that is not one (named by the environment or by the system property), one
outside the supported range, one of another C++ ABI, a native library built for another
libtorch, a missing compiler: one line each naming what is wrong, exit 1, nothing written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from gradbridge import libtorch, native
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


def test_a_libtorch_folder_named_by_the_system_property_that_is_not_one(models, data, tmp_path):
    folder = tmp_path / "not-libtorch"
    folder.mkdir()
    result = _train(models, data, tmp_path, JAVA_OPTS=f"-Dgradbridge.libtorch.path={folder}")
    assert one_error_line(result).startswith(f"{folder} (-Dgradbridge.libtorch.path) is not a libtorch folder: ")
    assert stray_files(tmp_path, keep=("data.npz", "not-libtorch")) == []


def _fake_libtorch(tmp_path, version: str, c10_text: str) -> Path:
    """A pip-torch-shaped folder (torch/lib beside torch/version.py) whose libraries are never loaded:
    the checks refuse it first."""
    lib = tmp_path / "torch" / "lib"
    lib.mkdir(parents=True)
    (lib / "libc10.so").write_text(c10_text)
    (lib / "libtorch_cpu.so").write_text("not loaded")
    (lib.parent / "version.py").write_text(f"__version__ = '{version}+cpu'\n")
    return lib


def test_a_libtorch_outside_the_supported_range(models, data, tmp_path):
    folder = _fake_libtorch(tmp_path, "2.6.0", "_ZNSt7__cxx1112basic_string")
    result = _train(models, data, tmp_path, GRADBRIDGE_LIBTORCH=str(folder))
    assert one_error_line(result) == (
        f"{folder} (GRADBRIDGE_LIBTORCH) holds libtorch 2.6.0, outside gradbridge's supported range "
        f"{libtorch.supported()}: name the torch/lib folder of a torch in that range")
    assert stray_files(tmp_path, keep=("data.npz", "torch")) == []


def test_a_libtorch_of_another_cxx_abi(models, data, tmp_path):
    built = (JAR_LIBRARY / native.JAR_PROPERTIES).read_text()
    version = next(line.split("=", 1)[1] for line in built.splitlines() if line.startswith("torch_version="))
    folder = _fake_libtorch(tmp_path, version, "_ZNSs4_Rep10_M_destroyERKSaIcE")  # pre-C++11 std::string only
    result = _train(models, data, tmp_path, GRADBRIDGE_LIBTORCH=str(folder))
    line = one_error_line(result)
    assert line.startswith(f"{folder} (GRADBRIDGE_LIBTORCH) holds libtorch {version} built with the pre-C++11 "
                           "ABI (C++11 ABI 0), but gradbridge's native library "), line
    assert line.endswith("was built for C++11 ABI 1: name a libtorch of C++11 ABI 1 (pip's torch is one), or "
                         "build the native library against this one (python -m gradbridge.native build)"), line
    assert stray_files(tmp_path, keep=("data.npz", "torch")) == []


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
