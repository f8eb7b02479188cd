"""Devices (``--device``, ``device=``, ``TrainingModule.load(path, device)``, ``Trainer.optDevice``) on any
machine: ``cpu`` is what no option always was, bit for bit; a device string that names no device, and a CUDA
device this machine does not have, are one line naming the device and why, on every path (Python, Java in this
process, a JVM of its own, both command lines). The GPU runs themselves are tests/test_cuda.py's (marker
``cuda``), and tools/gpu_check.sh runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gradbridge import EpochRecord, History, export_training_module, java, messages, reference
from gradbridge._runtime import classpath, devices, launcher, native
from gradbridge._runtime.devtree import root
from gradbridge.commands import doctor
from gradbridge.errors import GradbridgeError, InvalidInputError
from gradbridge.models import mlp
from tests.conftest import NO_CUDA, cuda_device_count
from tests.data import labelled

REPO_ROOT = root()
TRAIN_SCRIPT = REPO_ROOT / "build" / "install" / "gradbridge" / "bin" / "gradbridge-train"
GPU_CHECK = REPO_ROOT / "tools" / "gpu_check.sh"
no_gpu = pytest.mark.skipif(cuda_device_count() > 0, reason="this machine has a CUDA device")


@pytest.fixture(scope="module")
def dropout_mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("devices")
    torch.manual_seed(0)
    path = export_training_module(mlp(6, (16, 16), 3, dropout=0.25), "cross_entropy", {"name": "adam", "lr": 0.01},
                                  folder / "mlp.pt", example_inputs=(torch.zeros(4, 6), torch.zeros(4, dtype=torch.int64)))
    x, y = labelled(40, labels="signs")
    np.savez(folder / "train.npz", x=x, y=y)
    return path


def _lines(history: History):
    """Each record's line without its wall time."""
    return [{k: v for k, v in record.to_json().items() if k != "elapsed_s"} for record in history]


def _gradbridge(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gradbridge", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO_ROOT, env={**os.environ, **(env or {})})


def _train_cli(*args, env=None):
    assert TRAIN_SCRIPT.exists(), f"{TRAIN_SCRIPT} is missing: run `gradle installDist` (part of `make test`)"
    return subprocess.run([str(TRAIN_SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=REPO_ROOT,
                          env={**os.environ, **(env or {})})


def _one_error_line(result, prefix: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
    assert len(errors) == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    return errors[0][len(prefix):]


def _on_this_torch() -> dict:
    """The environment of a JVM of its own on this Python's libtorch (a CUDA build) and its native library."""
    return {"GRADBRIDGE_LIBTORCH": str(native.torch_dir() / "lib"), "GRADBRIDGE_NATIVE_LIBRARY": str(native.ensure())}


# ---- device strings and their lines ----

def test_device_strings_read_the_same_way_everywhere():
    assert [devices.canonical(d) for d in ("cpu", "cuda", "cuda:0", "cuda:12", "cuda:007")] == \
        ["cpu", "cuda:0", "cuda:0", "cuda:12", "cuda:7"]
    for bad in ("gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", " cpu", "cpu:0", "", None, 0):
        with pytest.raises(InvalidInputError) as refused:
            devices.canonical(bad)
        assert str(refused.value) == messages.unknown_device(bad) == \
            f"unknown device '{bad}'; expected cpu, cuda or cuda:N"


def test_java_prints_the_device_lines_python_prints(jvm):
    import jpype

    Platform = jpype.JClass("dev.gradbridge.internal.PlatformMessages")
    assert str(Platform.unknownDevice("gpu")) == messages.unknown_device("gpu")
    assert str(Platform.deviceUnavailable("cuda:1", "why")) == messages.device_unavailable("cuda:1", "why")
    for count in (0, 1, 3):
        for driver in (False, True):
            assert str(Platform.cudaDevicesSeen("2.7.1+cu126", count, driver)) == \
                messages.cuda_devices_seen("2.7.1+cu126", count, driver)
    assert messages.cuda_devices_seen("2.7.1+cu126", 2, True) == "this libtorch (2.7.1+cu126) sees 2 CUDA devices " \
                                                                 "(cuda:0 to cuda:1)"
    assert str(Platform.cudaCpuBuild("2.7.1 at /l")) == messages.cuda_cpu_build("2.7.1 at /l")
    assert str(Platform.cudaUnloadable("/l/libtorch_cuda.so", "x")) == messages.cuda_unloadable("/l/libtorch_cuda.so", "x")
    assert (str(Platform.CUBLAS_WORKSPACE_CONFIG), str(Platform.CUBLAS_WORKSPACE_VALUE)) == \
        (messages.CUBLAS_WORKSPACE_CONFIG, messages.CUBLAS_WORKSPACE_VALUE) == ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def test_an_unknown_device_is_one_line_on_every_path(jvm, dropout_mlp):
    import jpype

    x, y = labelled(40, labels="signs")
    expected = messages.unknown_device("gpu")
    for call in (lambda: reference.train(dropout_mlp, x, y, epochs=1, device="gpu"),
                 lambda: java.train(dropout_mlp, x, y, epochs=1, device="gpu"),
                 lambda: launcher.train(dropout_mlp, dropout_mlp.parent / "train.npz", epochs=1, device="gpu",
                                        history=dropout_mlp.parent / "h.jsonl")):
        with pytest.raises(InvalidInputError) as refused:
            call()
        assert str(refused.value) == expected
    TrainingModule = jpype.JClass("dev.gradbridge.TrainingModule")
    Paths = jpype.JClass("java.nio.file.Paths")
    for call in (lambda: TrainingModule.load(Paths.get(str(dropout_mlp)), "gpu"),
                 lambda: jpype.JClass("dev.gradbridge.Trainer").builder().optDevice("gpu")):
        with pytest.raises(jpype.JException) as refused:
            call()
        assert refused.value.getClass().getName() == "dev.gradbridge.InvalidInputException"
        assert str(refused.value.getMessage()) == expected
    data = dropout_mlp.parent / "train.npz"
    assert _one_error_line(_gradbridge("parity", dropout_mlp, "--data", data, "--device", "gpu"),
                           "gradbridge: error: ") == expected
    assert _one_error_line(_train_cli("--model", dropout_mlp, "--data", data, "--device", "gpu"), "error: ") == expected
    assert not (dropout_mlp.parent / "h.jsonl").exists()


@no_gpu
def test_a_cuda_device_this_machine_lacks_is_one_line_on_every_path(jvm, dropout_mlp, tmp_path):
    import jpype

    x, y = labelled(40, labels="signs")
    data = dropout_mlp.parent / "train.npz"
    seen = messages.cuda_devices_seen(torch.__version__, 0, devices.driver_loads())
    if torch.version.cuda is None:
        seen = messages.cuda_cpu_build(f"{torch.__version__} at {Path(torch.__file__).parent / 'lib'}")
    # Python's check, before anything trains (java.train's too: Java shares this process's torch)
    for device in ("cuda", "cuda:0", "cuda:2"):
        expected = messages.device_unavailable(devices.canonical(device), seen)
        assert expected.startswith(f"{devices.canonical(device)} is not available: this libtorch (")
        for call in (lambda: reference.train(dropout_mlp, x, y, epochs=1, device=device),
                     lambda: java.train(dropout_mlp, x, y, epochs=1, device=device),
                     lambda: launcher.train(dropout_mlp, data, epochs=1, device=device, history=tmp_path / "h.jsonl")):
            with pytest.raises(InvalidInputError) as refused:
                call()
            assert str(refused.value) == expected
    assert _one_error_line(_gradbridge("parity", dropout_mlp, "--data", data, "--device", "cuda:1"),
                           "gradbridge: error: ") == messages.device_unavailable("cuda:1", seen)
    # Java's own check, in this process: libtorch_cuda is mapped here (Python's torch loaded it)
    Paths = jpype.JClass("java.nio.file.Paths")
    with pytest.raises(jpype.JException) as refused:
        jpype.JClass("dev.gradbridge.TrainingModule").load(Paths.get(str(dropout_mlp)), "cuda")
    assert str(refused.value.getMessage()) == messages.device_unavailable("cuda:0", seen)
    # a JVM of its own on this torch's lib folder: the first request loads libtorch_cuda (no setting needed)
    result = _train_cli("--model", dropout_mlp, "--data", data, "--device", "cuda:0", "--history", tmp_path / "h.jsonl",
                        env=_on_this_torch())
    assert _one_error_line(result, "error: ") == messages.device_unavailable("cuda:0", seen)
    # a JVM of its own on the pytorch-native jar's libtorch, a CPU build
    if any(Path(e).name.startswith(classpath.NATIVE_JAR_PREFIX) for e in classpath.resolve().entries):
        result = _train_cli("--model", dropout_mlp, "--data", data, "--device", "cuda", "--history", tmp_path / "h.jsonl")
        line = _one_error_line(result, "error: ")
        assert re.fullmatch(r"cuda:0 is not available: this libtorch \(2\.\d+\.\d+ at .+\) is a CPU build \(no "
                            r"libtorch_cuda\.so\): use a CUDA build \(pip's torch on Linux; for a JVM of its own, "
                            r"GRADBRIDGE_LIBTORCH=its torch/lib\)", line), line
    assert not (tmp_path / "h.jsonl").exists()


# ---- cpu: what no option always was ----

def test_device_cpu_trains_as_no_option_does_bit_for_bit(jvm, dropout_mlp, tmp_path):
    import jpype

    x, y = labelled(40, labels="signs")
    val = labelled(12, seed=1, labels="signs")
    settings = dict(epochs=2, batch_size=8, seed=3, val=val)
    for mode in ("step", "fused", "full"):
        plain = java.train(dropout_mlp, x, y, mode=mode, **settings)
        assert _lines(java.train(dropout_mlp, x, y, mode=mode, device="cpu", **settings)) == _lines(plain)
        assert _lines(reference.train(dropout_mlp, x, y, mode=mode, device="cpu", **settings)) == \
            _lines(reference.train(dropout_mlp, x, y, mode=mode, **settings))
        assert all("device" not in line and "deterministic" not in line for line in _lines(plain))
    # Java's API: load onto cpu, a Trainer told cpu
    module = jpype.JClass("dev.gradbridge.TrainingModule").load(jpype.JClass("java.nio.file.Paths").get(str(dropout_mlp)),
                                                                 "cpu")
    data = java.dataset(x, y, "training data")
    try:
        assert str(module.getDevice()) == "cpu"
        trainer = jpype.JClass("dev.gradbridge.Trainer").builder().optEpochs(2).optBatchSize(8).optSeed(3) \
            .optDevice("cpu").build()
        told = History.from_java(trainer.fit(module, data))
    finally:
        data.close()
        module.close()
    assert _lines(told) == _lines(java.train(dropout_mlp, x, y, epochs=2, batch_size=8, seed=3))
    # a JVM of its own: --device cpu and no option write the same history
    files = dict(history=tmp_path / "h.jsonl", epochs=2, batch_size=8, seed=3)
    train_npz = dropout_mlp.parent / "train.npz"
    assert _lines(launcher.train(dropout_mlp, train_npz, device="cpu", **files)) == \
        _lines(launcher.train(dropout_mlp, train_npz, **files))


def test_parity_device_cpu_prints_what_no_option_prints(dropout_mlp):
    args = ("parity", dropout_mlp, "--data", dropout_mlp.parent / "train.npz", "--epochs", "2", "--batch-size", "8")
    plain, on_cpu = _gradbridge(*args), _gradbridge(*args, "--device", "cpu")
    assert plain.returncode == on_cpu.returncode == 0, plain.stderr + on_cpu.stderr
    assert on_cpu.stdout == plain.stdout and "bitwise identical over 2 epochs" in plain.stdout


# ---- records, doctor, the marker, the GPU script ----

def test_a_record_names_its_device_after_threads_and_before_values():
    record = EpochRecord(0, 1.5, {"w": np.array([1.0])}, digests={"w": "ab"}, lrs=[0.1], device="cuda:0",
                         deterministic=True)
    document = record.to_json()
    assert list(document)[-3:] == ["lrs", "device", "deterministic"]
    assert EpochRecord.from_json(json.loads(json.dumps(document))).device == "cuda:0"
    assert EpochRecord.from_json(document).deterministic is True
    assert "device" not in EpochRecord(0, 1.5, {}, digests={}).to_json()
    with pytest.raises(ValueError, match="expected keys"):
        EpochRecord.from_json({**{k: v for k, v in document.items() if k != "lrs"}, "lrs": [0.1]})


def test_doctor_says_whether_torch_is_a_cuda_build_and_what_it_sees():
    lines = []
    doctor.run(lines.append)
    rows = {line[:22].strip(): line[22:].strip() for line in lines if not line.startswith(("problem", "no problems"))}
    assert rows["CUDA"] == devices.describe()
    if torch.version.cuda is None:
        assert rows["CUDA"] == f"torch {torch.__version__} is a CPU build: training on cpu only"
    elif cuda_device_count() == 0:
        assert rows["CUDA"].startswith(f"torch {torch.__version__} is a CUDA {torch.version.cuda} build; 0 CUDA devices")
    else:
        assert f"cuda:0 {torch.cuda.get_device_name(0)}" in rows["CUDA"]


@no_gpu
def test_the_cuda_tests_are_skipped_here_and_say_why():
    result = subprocess.run([sys.executable, "-m", "pytest", "tests/test_cuda.py", "-rs", "-q", "-p", "no:cacheprovider"],
                            capture_output=True, text=True, cwd=REPO_ROOT,
                            env={k: v for k, v in os.environ.items() if k != "GRADBRIDGE_CUDA_TESTS_ON"})
    assert result.returncode == 0, result.stdout + result.stderr
    skipped = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all(line.endswith(NO_CUDA) for line in skipped), result.stdout
    assert re.search(r"\b\d+ skipped\b", result.stdout) and " passed" not in result.stdout, result.stdout
    markers = subprocess.run([sys.executable, "-m", "pytest", "--markers"], capture_output=True, text=True,
                             cwd=REPO_ROOT).stdout
    assert "@pytest.mark.cuda: needs a CUDA device" in markers


def test_the_gpu_check_script_runs_its_cpu_parts():
    assert subprocess.run(["bash", "-n", str(GPU_CHECK)]).returncode == 0
    usage = subprocess.run([str(GPU_CHECK), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: tools/gpu_check.sh"), usage.stdout + usage.stderr
    unknown = subprocess.run([str(GPU_CHECK), "--bogus"], capture_output=True, text=True)
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == \
        ["gpu_check.sh: error: unknown argument --bogus (see --help)"]
    if cuda_device_count() == 0:  # the check itself needs a GPU: one line saying so, nothing built
        refused = subprocess.run([str(GPU_CHECK), "--python", sys.executable], capture_output=True, text=True,
                                 cwd=REPO_ROOT)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stderr.strip().splitlines()[-1].startswith("gpu_check.sh: error: no CUDA device"), refused.stderr
