"""Fault suite, surface "native library": the pairing of libtorch and gradbridge's native library.

A libtorch folder that is not one (named by the environment or by the system property), one
outside the supported range, one of another C++ ABI, a native library built for another
libtorch, a missing compiler: one line each naming what is wrong, exit 1, nothing written.
A truncated or damaged library never reaches the dynamic linker (which would die of SIGBUS or
SIGILL, with the JVM's crash banner and an hs_err file): a named one is refused in one line, a
cached one (libtorch extracted from the jar, the jar's native library, the one compiled per torch)
is made again with one line and the run goes on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gradbridge import messages
from gradbridge._runtime import libtorch, native
from gradbridge.errors import SetupError
from tests.faults import minimal_elf, one_error_line, stray_files, train_cli

REPO_ROOT = Path(__file__).resolve().parents[1]
JAR_LIBRARY = REPO_ROOT / "build" / "native-resources" / native.JAR_FOLDER


@pytest.fixture
def data(tmp_path):
    x = np.arange(8, dtype=np.float32).reshape(8, 1)
    path = tmp_path / "data.npz"
    np.savez(path, x=x, y=2 * x)
    return path


def _train(models, data, tmp_path, **env):
    """gradbridge-train in tmp_path (where a crashing JVM would leave its hs_err_pid*.log)."""
    return train_cli("--model", models["linear_regression.pt"], "--data", data, "--epochs", 1, "--batch-size", 4,
                     "--history", tmp_path / "h.jsonl", env={**os.environ, **env}, cwd=tmp_path)


def _jar_build() -> dict:
    return native.read_properties(JAR_LIBRARY / native.JAR_PROPERTIES)


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
    version = _jar_build()["torch_version"]
    folder = _fake_libtorch(tmp_path, version, "_ZNSs4_Rep10_M_destroyERKSaIcE")  # pre-C++11 std::string only
    for name in ("libc10.so", "libtorch_cpu.so"):  # ELF shared objects, so that the ABI check is reached
        (folder / name).write_bytes(minimal_elf((folder / name).read_bytes()))
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


def test_a_cxx_naming_no_compiler_is_one_line_naming_cxx(tmp_path, monkeypatch):
    cxx = str(tmp_path / "no-such-g++")
    monkeypatch.setenv("CXX", cxx)
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_prebuilt_folders", lambda build: [])
    with pytest.raises(SetupError) as info:
        native.ensure(quiet=True)
    assert str(info.value) == (f"CXX={cxx} names no compiler (not a file and not on PATH), needed to build "
                               f"gradbridge's native library for torch {native.torch_version()}: set CXX to a C++ "
                               "compiler such as g++, or unset it")
    assert not (tmp_path / "cache").exists()


def test_no_compiler_at_all_is_one_line_naming_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, no c++
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_prebuilt_folders", lambda build: [])
    with pytest.raises(SetupError) as info:
        native.ensure(quiet=True)
    assert str(info.value) == (f"no C++ compiler to build gradbridge's native library for torch "
                               f"{native.torch_version()}: install g++ (e.g. apt-get install g++) or set CXX to one")
    assert not (tmp_path / "cache").exists()


def test_an_unwritable_cache_folder_names_gradbridge_cache_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    monkeypatch.setenv(native.CACHE_ENV, str(blocker / "cache"))
    monkeypatch.setattr(native, "_prebuilt_folders", lambda build: [])
    with pytest.raises(SetupError) as info:
        native.ensure(quiet=True)
    line = str(info.value)
    assert line.startswith(f"cannot write gradbridge's cache folder {blocker / 'cache' / 'native'}/torch"), line
    assert line.endswith(f": {blocker} is a file, not a folder; set GRADBRIDGE_CACHE_DIR to a writable folder"), line
    assert "(GRADBRIDGE_CACHE_DIR, by default ~/.cache/gradbridge)" in line, line
    assert stray_files(tmp_path) == ["a-file"]


def test_an_unwritable_cache_folder_in_java_names_gradbridge_cache_dir(models, data, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    result = _train(models, data, tmp_path, GRADBRIDGE_CACHE_DIR=str(blocker / "cache"))
    line = one_error_line(result)
    assert line.startswith(f"cannot write gradbridge's cache folder {blocker / 'cache'}"), line
    assert line.endswith(f": {blocker} is a file, not a folder; set GRADBRIDGE_CACHE_DIR to a writable folder"), line
    assert stray_files(tmp_path, keep=("data.npz", "a-file")) == []


def test_a_read_only_cache_folder_in_java_names_gradbridge_cache_dir(models, data, tmp_path):
    cache = tmp_path / "read-only"
    cache.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(cache)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here (not root)")
    try:
        result = _train(models, data, tmp_path, GRADBRIDGE_CACHE_DIR=str(cache))
    finally:
        subprocess.run(["umount", str(cache)], check=True)
    assert one_error_line(result) == messages.cache_unwritable(str(cache / "libtorch"), "Read-only file system")
    assert stray_files(tmp_path, keep=("data.npz", "read-only")) == []


# ---- a library that must never reach the dynamic linker ----

def _no_crash(result, tmp_path) -> None:
    assert result.returncode != 134 and "A fatal error has been detected" not in result.stdout + result.stderr
    assert not list(tmp_path.glob("hs_err_pid*.log"))


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as file:
        file.truncate(size)


def _damage(path: Path, at: int) -> None:
    """Same size, other bytes: the ELF headers stay whole, the code does not."""
    with open(path, "r+b") as file:
        file.seek(at)
        chunk = file.read(4096)
        file.seek(at)
        file.write(bytes(b ^ 0xFF for b in chunk))


def _linked_libtorch(tmp_path) -> Path:
    """A pip-torch-shaped copy of this Python's torch/lib: links to its libraries, version.py copied."""
    lib = tmp_path / "torch" / "lib"
    lib.mkdir(parents=True)
    for file in libtorch.lib_dir().iterdir():
        (lib / file.name).symlink_to(file)
    shutil.copyfile(libtorch.lib_dir().parent / "version.py", lib.parent / "version.py")
    return lib


def test_a_libtorch_folder_with_a_truncated_libtorch_cpu_is_refused(models, data, tmp_path):
    folder = _linked_libtorch(tmp_path)
    (folder / "libtorch_cpu.so").unlink()
    with open(libtorch.lib_dir() / "libtorch_cpu.so", "rb") as whole:
        (folder / "libtorch_cpu.so").write_bytes(whole.read(1 << 20))
    result = _train(models, data, tmp_path, GRADBRIDGE_LIBTORCH=str(folder))
    line = one_error_line(result)
    assert line.startswith(f"cannot load libtorch's {folder / 'libtorch_cpu.so'} (GRADBRIDGE_LIBTORCH): truncated: "
                           "its headers need "), line
    assert line.endswith(f" bytes, the file has {1 << 20}"), line
    _no_crash(result, tmp_path)
    assert stray_files(tmp_path, keep=("data.npz", "torch")) == []


def test_a_libtorch_folder_whose_libc10_is_not_a_library_says_so(models, data, tmp_path):
    folder = _fake_libtorch(tmp_path, _jar_build()["torch_version"], "_ZNSs4_Rep10_M_destroyERKSaIcE")
    result = _train(models, data, tmp_path, GRADBRIDGE_LIBTORCH=str(folder))
    assert one_error_line(result) == (f"cannot load libtorch's {folder / 'libc10.so'} (GRADBRIDGE_LIBTORCH): "
                                      "not an ELF shared library")
    assert stray_files(tmp_path, keep=("data.npz", "torch")) == []


def _named_library(tmp_path, name: str = "libgradbridge_jni-copy.so") -> Path:
    """A copy of the jar's native library and its properties (which record its SHA-256)."""
    built = next(JAR_LIBRARY.glob("libgradbridge_jni-torch*.so"))
    library = tmp_path / name
    shutil.copyfile(built, library)
    shutil.copyfile(built.with_suffix(".properties"), library.with_suffix(".properties"))
    return library


def test_a_truncated_native_library_named_by_the_environment_is_refused(models, data, tmp_path):
    library = _named_library(tmp_path)
    _truncate(library, 4096)
    result = _train(models, data, tmp_path, GRADBRIDGE_NATIVE_LIBRARY=str(library))
    line = one_error_line(result)
    assert line.startswith(f"cannot load gradbridge's native library {library} (GRADBRIDGE_NATIVE_LIBRARY): "
                           "truncated: its headers need "), line
    _no_crash(result, tmp_path)
    assert stray_files(tmp_path, keep=("data.npz", library.name, library.with_suffix(".properties").name)) == []


def test_a_damaged_native_library_of_the_same_size_is_refused_by_its_digest(models, data, tmp_path):
    library = _named_library(tmp_path)
    size = library.stat().st_size
    _damage(library, size // 2)
    result = _train(models, data, tmp_path, JAVA_OPTS=f"-Dgradbridge.native.library={library}")
    line = one_error_line(result)
    recorded = native.read_properties(library.with_suffix(".properties"))[native.DIGEST_KEY]
    assert line == (f"cannot load gradbridge's native library {library} (-Dgradbridge.native.library): its SHA-256 "
                    f"is {native.sha256_file(library)}, not the {recorded} recorded when it was built (damaged or "
                    "replaced)"), line
    _no_crash(result, tmp_path)


@pytest.mark.parametrize("name", ["a", "so", ".so", "libgradbridge.dylib"])
def test_a_native_library_not_named_so_is_one_line(models, data, tmp_path, name):
    library = tmp_path / name
    library.write_bytes(b"x")
    result = _train(models, data, tmp_path, GRADBRIDGE_NATIVE_LIBRARY=str(library))
    assert one_error_line(result) == (
        f"gradbridge's native library {library} (GRADBRIDGE_NATIVE_LIBRARY) is not named *.so: name the .so file "
        "that python -m gradbridge.native build --out DIR wrote (its .properties file lies beside it)")


@pytest.mark.parametrize("text, key, shown", [
    ("source_sha256=0\n", "torch_version", "has no torch_version"),
    ("torch_version=2.7.1\n", "cxx11_abi", "has no cxx11_abi"),
    ("torch_version=2.7.1\ncxx11_abi=yes\n", "cxx11_abi", "holds cxx11_abi=yes"),
])
def test_a_native_library_whose_properties_do_not_say_what_it_was_built_for(models, data, tmp_path, text, key,
                                                                           shown):
    library = _named_library(tmp_path)
    library.with_suffix(".properties").write_text(text)
    result = _train(models, data, tmp_path, GRADBRIDGE_NATIVE_LIBRARY=str(library))
    line = one_error_line(result)
    assert line == (f"{library.with_suffix('.properties')} (what gradbridge's native library {library.name} was built "
                    f"for) {shown}: rebuild the library with python -m gradbridge.native build --out DIR, which "
                    "writes both files"), line
    assert "null" not in line


@pytest.mark.parametrize("property_, value", [("numThreads", "abc"), ("numThreads", "0"), ("numThreads", "-2"),
                                              ("numInteropThreads", "1e3"), ("numThreads", "99999999999")])
def test_a_bad_thread_count_is_one_line_naming_the_property(models, data, tmp_path, property_, value):
    result = _train(models, data, tmp_path, JAVA_OPTS=f"-Dgradbridge.{property_}={value}")
    assert one_error_line(result) == (f"-Dgradbridge.{property_}={value}: expected a whole number of threads in "
                                      "1..4096")
    assert stray_files(tmp_path, keep=("data.npz",)) == []


def _extracted(cache: Path, kind: str) -> Path:
    folders = list((cache / kind).iterdir())
    assert len(folders) == 1, folders
    return folders[0]


def test_the_extracted_libtorch_and_native_library_are_extracted_again_when_damaged(models, data, tmp_path):
    # Given libtorch and the native library extracted from the jars into a cache of this test's own
    cache = tmp_path / "cache"
    first = _train(models, data, tmp_path, GRADBRIDGE_CACHE_DIR=str(cache))
    assert first.returncode == 0, first.stderr
    libtorch_folder, native_folder = _extracted(cache, "libtorch"), _extracted(cache, "native")
    core = libtorch_folder / "libtorch_cpu.so"
    whole = native.sha256_file(core)
    # When libtorch_cpu.so is cut short
    _truncate(core, core.stat().st_size // 2)
    second = _train(models, data, tmp_path, GRADBRIDGE_CACHE_DIR=str(cache))
    # Then the next start says so in one line, extracts it again, and trains
    assert second.returncode == 0, second.stderr
    lines = [line for line in second.stderr.splitlines() if line.startswith("gradbridge: the cached")]
    assert lines == [f"gradbridge: the cached libtorch in {libtorch_folder} is damaged (libtorch_cpu.so: its SHA-256 "
                     f"is {lines[0].split('its SHA-256 is ')[1].split(',')[0]}, not the {whole} recorded when it was "
                     "built (damaged or replaced)): extracting it again"], second.stderr
    assert native.sha256_file(core) == whole
    # And a same-size damage of libc10.so and of the native library: found by their digests
    _damage(libtorch_folder / "libc10.so", 200_000)
    library = next(native_folder.glob("*.so"))
    _damage(library, library.stat().st_size // 2)
    third = _train(models, data, tmp_path, GRADBRIDGE_CACHE_DIR=str(cache))
    assert third.returncode == 0, third.stderr
    lines = [line for line in third.stderr.splitlines() if line.startswith("gradbridge: the cached")]
    assert len(lines) == 2 and "(libc10.so: its SHA-256 is " in lines[0], third.stderr
    assert lines[1].startswith(f"gradbridge: the cached gradbridge's native library in {native_folder} is damaged "
                               f"({library.name}: its SHA-256 is "), third.stderr
    _no_crash(third, tmp_path)
    assert sorted(p.name for p in (cache / "libtorch").iterdir()) == [libtorch_folder.name]  # no temp folder left


# ---- the library compiled per torch (Python) ----

@pytest.fixture
def cached_build(tmp_path, monkeypatch):
    """The native library for this torch in a cache of this test's own (a copy of the jar's), no prebuilt one."""
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_prebuilt_folders", lambda build: [])
    build = native.current_build()
    folder = native.cache_folder(build)
    folder.mkdir(parents=True)
    source = build.library(JAR_LIBRARY)
    shutil.copyfile(source, build.library(folder))
    shutil.copyfile(build.properties(JAR_LIBRARY), build.properties(folder))
    compiled = []

    def compile_library(build_, sources, folder_, quiet=False):  # stands in for g++ (~30 s): puts the good copy back
        compiled.append(folder_)
        shutil.copyfile(source, build_.library(folder_))
        return build_.library(folder_)

    monkeypatch.setattr(native, "compile_library", compile_library)
    return build, folder, compiled


def test_an_intact_cached_native_library_is_used_as_it_is(cached_build, capsys):
    build, folder, compiled = cached_build
    assert native.ensure(quiet=True) == build.library(folder)
    assert compiled == [] and capsys.readouterr().err == ""


@pytest.mark.parametrize("damage", ["truncated", "same size"])
def test_a_damaged_cached_native_library_is_built_again_with_one_line(cached_build, capsys, damage):
    build, folder, compiled = cached_build
    library = build.library(folder)
    if damage == "truncated":
        _truncate(library, 8192)
    else:
        _damage(library, library.stat().st_size // 2)
    assert native.ensure(quiet=True) == library
    assert compiled == [folder]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"gradbridge: the cached gradbridge's native library in {folder} is "
                                               f"damaged ({library.name}: "), err
    assert err[0].endswith("): building it again"), err
    assert ("truncated: its headers need " if damage == "truncated" else "its SHA-256 is ") in err[0]


def test_a_self_check_verdict_that_cannot_be_written_names_gradbridge_cache_dir(tmp_path, monkeypatch):
    from gradbridge._runtime import torch_gate

    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    monkeypatch.setenv(native.CACHE_ENV, str(blocker / "cache"))
    with pytest.raises(SetupError) as info:
        torch_gate.record(True, "passed", 1.0)
    assert str(info.value) == (f"cannot write gradbridge's cache folder {blocker / 'cache' / torch_gate.FOLDER} "
                               f"(GRADBRIDGE_CACHE_DIR, by default ~/.cache/gradbridge): {blocker} is a file, not "
                               "a folder; set GRADBRIDGE_CACHE_DIR to a writable folder")


def _foreign_libraries() -> list:
    """Shared libraries that are not gradbridge's: one the linker refuses (no segments), and zlib's when
    it is where Debian-like systems keep it (it loads, and has no JNI entry points)."""
    cases = ["no segments"]
    if Path("/lib/x86_64-linux-gnu/libz.so.1").is_file() and os.uname().machine == "x86_64":
        cases.append("/lib/x86_64-linux-gnu/libz.so.1")
    return cases


@pytest.mark.parametrize("foreign", _foreign_libraries())
def test_a_shared_library_that_is_not_gradbridges_is_one_line(models, data, tmp_path, foreign):
    library = tmp_path / "libnot-gradbridge.so"
    if foreign == "no segments":
        library.write_bytes(minimal_elf())
    else:
        shutil.copyfile(foreign, library)
    library.with_suffix(".properties").write_text(f"torch_version={_jar_build()['torch_version']}\ncxx11_abi=1\n")
    result = _train(models, data, tmp_path, GRADBRIDGE_NATIVE_LIBRARY=str(library))
    line = one_error_line(result)
    expected = ("object file has no loadable segments" if foreign == "no segments"
                else "it is not gradbridge's JNI library (")
    assert line.startswith(f"cannot load gradbridge's native library {library}") and expected in line, line
    _no_crash(result, tmp_path)


def test_a_folder_named_as_the_native_library_is_one_line(models, data, tmp_path):
    result = _train(models, data, tmp_path, GRADBRIDGE_NATIVE_LIBRARY=str(tmp_path))
    assert one_error_line(result) == (f"gradbridge's native library {tmp_path} (GRADBRIDGE_NATIVE_LIBRARY) is a "
                                      "folder: name the .so file in it")
