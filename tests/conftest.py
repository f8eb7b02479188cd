"""Shared fixtures: the exported test modules, the one in-process JVM, gradbridge-serve's script and a Kafka
broker per module. Helpers that several test files share live in support modules beside them (tests/faults.py,
serving.py, kafka_support.py, data.py, ...), never in a test file."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

# The support modules hold asserts that once sat in test files: pytest explains their failures as it does a test's.
pytest.register_assert_rewrite("tests.data", "tests.kafka_support", "tests.online_support", "tests.protocol3_support",
                               "tests.serving", "tests.spark_support")

TESTS = Path(__file__).resolve().parent
REPO_ROOT = TESTS.parent


def _load_fixture_writer():
    spec = importlib.util.spec_from_file_location("export_java_test_models", TESTS / "fixtures" / "export_java_test_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict:
    """The fixture modules (good and bad) by file name, exported once per session."""
    return {path.name: path for path in _load_fixture_writer().write_fixtures(tmp_path_factory.mktemp("models")).values()}


@pytest.fixture(scope="session")
def model_path(models) -> Path:
    return models["linear_regression.pt"]


@pytest.fixture(scope="session")
def jvm(request):
    """The JVM in this process, from gradbridge's own pytest plugin (started once: JPype cannot restart it)."""
    import jpype

    assert request.config.pluginmanager.has_plugin("gradbridge"), "the pytest plugin is not registered: pip install -e ."
    assert not jpype.isJVMStarted(), "something started the JVM before gradbridge_jvm"
    gradbridge_jvm = request.getfixturevalue("gradbridge_jvm")
    assert jpype.isJVMStarted()
    return gradbridge_jvm


@pytest.fixture(scope="module")
def serve_script() -> Path:
    """gradbridge-serve's installed script (tests/serving.py starts it), built on first use."""
    from tests import serving

    return serving.script()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One KRaft broker for the module (tests/kafka_support.py): formatted, started on a free loopback port,
    stopped by PID."""
    from tests.kafka_support import kafka_broker

    folder = tmp_path_factory.mktemp("kafka")
    kafka_broker.start(folder)
    try:
        yield folder
    finally:
        kafka_broker.stop(folder)
        assert not kafka_broker.is_running(folder)


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="parity matrix: 20 epochs and every case through a subprocess too; the slow scenarios"
                          " (tests marked slow: Kafka broker restarts, repeated kill -9)")
    parser.addoption("--spark-lines", action="store_true", default=False,
                     help="the real-cluster Spark cases (tests/test_spark_cluster.py) on pip's oldest and newest "
                          "pyspark of each Scala line (gradle.properties sparkClusterVersions), each in its own "
                          "venv .venv-spark/<version>, instead of this venv's pyspark")


#: The reason a test marked cuda is skipped on a machine whose torch sees no CUDA device: a skip, never a pass.
NO_CUDA = "no CUDA device"


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.version.cuda is not None else 0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """With --full, the tests marked every_torch_full join every_torch (the newest torch's run), and the
    tests marked slow run; without it they are deselected (not skipped: they are not part of the default run).
    The tests marked cuda are skipped (NO_CUDA) where torch sees no CUDA device."""
    cuda = [item for item in items if item.get_closest_marker("cuda")]
    rehearsal = os.environ.get("GRADBRIDGE_CUDA_TESTS_ON") == "cpu"  # tests/test_cuda.py's docstring
    if cuda and not rehearsal and cuda_device_count() == 0:
        for item in cuda:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA))
    if config.getoption("--full"):
        for item in items:
            if item.get_closest_marker("every_torch_full"):
                item.add_marker(pytest.mark.every_torch)
    else:
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]


#: (Spark version, Scala version, test, outcome) of the real-cluster cases, for the summary table.
SPARK_RESULTS: list = []


#: Seconds spent per test file (setup, call and teardown), for the summary's table of where the run's time goes.
FILE_SECONDS: dict = {}


def pytest_runtest_logreport(report):
    """Keeps the outcome of each real-cluster case (tests/test_spark_cluster.py marks them with the Spark it ran on)
    and each file's time."""
    path = report.nodeid.split("::")[0]
    FILE_SECONDS[path] = FILE_SECONDS.get(path, 0.0) + report.duration
    spark = dict(report.user_properties).get("spark_cluster")
    if spark and (report.when == "call" or report.outcome == "failed"):
        outcome = {"passed": "bitwise with the replay", "skipped": "skipped"}.get(report.outcome, "FAILED")
        SPARK_RESULTS.append((*spark, report.nodeid.split("::")[-1], outcome))


def _spark_summary(terminalreporter):
    lines = [f"{'spark':<7} {'scala':<6} {'case':<72} result"]
    lines += [f"{version:<7} {scala:<6} {case:<72} {outcome}" for version, scala, case, outcome in SPARK_RESULTS]
    terminalreporter.write_sep("=", "gradbridge-spark on standalone clusters")
    terminalreporter.write_line("\n".join(lines))
    out = REPO_ROOT / "build" / "spark-lines.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def _cuda_summary(terminalreporter, cuda_tests):
    """tests/test_cuda.py's comparisons: case, format, where Java ran, bitwise or the largest difference."""
    import torch

    where = "the CPU (a rehearsal)" if cuda_tests.DEVICE == "cpu" else torch.cuda.get_device_name(0)
    lines = [f"{'case':<24} {'format':<12} {'java':<11} result (on {where}, torch {torch.__version__})"]
    lines += [f"{case:<24} {format:<12} {side:<11} {_verdict(report)}"
              for case, format, side, report in cuda_tests.RESULTS]
    _write_table(terminalreporter, "gradbridge on a CUDA device", lines, "cuda-parity.txt")


def _verdict(report) -> str:
    """A parity report in a table's cell: bitwise, or the largest differences."""
    return "bitwise" if report.bitwise else (
        f"max |dloss| {report.max_loss_delta:.2e}, max |dparam| {report.max_param_delta:.2e}")


def _write_table(terminalreporter, title: str, lines, name: str) -> None:
    """A summary table in pytest's report and in build/<name>."""
    terminalreporter.write_sep("=", title)
    terminalreporter.write_line("\n".join(lines))
    out = REPO_ROOT / "build" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def pytest_terminal_summary(terminalreporter):
    """The parity matrix as a table: case, mode, where Java ran, bitwise or max |difference|; the Spark clusters'."""
    import sys

    if FILE_SECONDS:
        _write_table(terminalreporter, "seconds per test file (the 25 slowest)",
                     [f"{seconds:8.1f}  {path}" for path, seconds in
                      sorted(FILE_SECONDS.items(), key=lambda kv: -kv[1])[:25]], "file-seconds.txt")
    if SPARK_RESULTS:
        _spark_summary(terminalreporter)
    cuda_tests = sys.modules.get("tests.test_cuda")
    if cuda_tests is not None and cuda_tests.RESULTS:
        _cuda_summary(terminalreporter, cuda_tests)
    matrix_tests = sys.modules.get("tests.matrix")
    if matrix_tests is None or not matrix_tests.RESULTS:
        return
    lines = [f"{'case':<42} {'mode':<6} {'java':<11} result"]
    lines += [f"{case:<42} {mode:<6} {side:<11} {_verdict(report)}"
              for case, mode, side, report in matrix_tests.RESULTS]
    _write_table(terminalreporter, "gradbridge parity matrix", lines, "parity-matrix.txt")
