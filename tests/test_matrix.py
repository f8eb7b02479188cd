"""The parity matrix on real data (scikit-learn's diabetes, breast_cancer, iris, digits).

CI: 20 of the 60 cases (5 models x 4 optimizers x {full batch, shuffled step, shuffled fused}:
matrix.DEFAULT_CASES, every model and optimizer in every mode) for 5 epochs in this process through
JPype (expected bitwise), and SUBPROCESS_CASES through `gradle train` (the pytorch-native-cpu jar's
libtorch; within rtol 1e-5, atol 1e-6). `pytest tests/test_matrix.py --full`: all 60 cases, 20 epochs,
and every case through a subprocess too.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradbridge import java, reference
from gradbridge._runtime import launcher
from gradbridge.parity import assert_histories_match
from gradbridge.parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL
from tests import matrix



@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    cache = {}

    def get(model_name, optimizer):
        if (model_name, optimizer) not in cache:
            cache[model_name, optimizer] = matrix.export(model_name, optimizer, folder)
        return cache[model_name, optimizer]
    return get


@pytest.fixture(scope="module")
def npz_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix-data")
    files = {}
    for model in matrix.MODELS.values():
        if model.data not in files:
            x, y = matrix.dataset(model.data)
            files[model.data] = folder / f"{model.data}.npz"
            np.savez(files[model.data], x=x, y=y)
    return files


def _epochs(request):
    return 20 if request.config.getoption("--full") else 5


def _in_process_case(case):
    marks = [pytest.mark.every_torch_java] + ([] if case in matrix.DEFAULT_CASES else [pytest.mark.slow])
    return pytest.param(*case, marks=marks, id="-".join(case))


@pytest.mark.parametrize("model_name, optimizer, mode", [_in_process_case(c) for c in matrix.CASES])
def test_in_process(jvm, request, exported, model_name, optimizer, mode):
    path = exported(model_name, optimizer)
    x, y = matrix.dataset(matrix.MODELS[model_name].data)
    settings = dict(epochs=_epochs(request), batch_size=matrix.BATCH, seed=1, mode=mode)
    in_java = java.train(path, x, y, **settings)
    in_python = reference.train(path, x, y, **settings)
    report = assert_histories_match(in_python, in_java)
    matrix.RESULTS.append((f"{model_name} / {optimizer}", mode, "in-process", report))
    assert report.bitwise


def _subprocess_cases(config):
    return matrix.CASES if config.getoption("--full") else matrix.SUBPROCESS_CASES


def pytest_generate_tests(metafunc):
    if "subprocess_case" in metafunc.fixturenames:
        cases = _subprocess_cases(metafunc.config)
        metafunc.parametrize("subprocess_case", cases, ids=["-".join(c) for c in cases])


@pytest.mark.gradle
@pytest.mark.every_torch_full
def test_subprocess(request, exported, npz_files, tmp_path, subprocess_case):
    model_name, optimizer, mode = subprocess_case
    path = exported(model_name, optimizer)
    data = matrix.MODELS[model_name].data
    settings = dict(epochs=_epochs(request), batch_size=matrix.BATCH, seed=1, mode=mode)
    if request.config.getoption("--full"):
        history = launcher.train(path, npz_files[data], history=tmp_path / "h.jsonl", **settings)
    else:  # through Gradle, as a user would: `gradle train -Pargs="..."`
        from gradbridge import History
        from gradbridge._runtime.gradle import run_task

        result = run_task("train", ["--model", path, "--data", npz_files[data], "--history", tmp_path / "h.jsonl",
                                    *[f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]])
        assert result.returncode == 0, result.stderr
        history = History.load(tmp_path / "h.jsonl")
    x, y = matrix.dataset(data)
    in_python = reference.train(path, x, y, **settings)
    report = assert_histories_match(in_python, history, rtol=SEPARATE_JVM_RTOL, atol=SEPARATE_JVM_ATOL)
    matrix.RESULTS.append((f"{model_name} / {optimizer}", mode, "subprocess", report))
