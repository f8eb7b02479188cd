"""The supported torch range, on whichever torch of it this venv holds (`make test` runs this file on
the oldest, .venv, and on the newest, .venv-newest).

- The range is defined once (python/gradbridge/requirements.txt) and read by the library: a lower end
  only, the libtorch of the separate JVM's distribution (gradle.properties); "verified up to" is
  VERIFIED_TORCH beside it, and docs/torch-versions.md names both (tests/test_torch_gate.py: a newer torch).
- A torch below the range gets one line naming the range before any JVM starts; in range, Java in
  this process runs on this torch through gradbridge's native library built for it, bit for bit.
- gradbridge's own TorchScript calls print none of torch's deprecation warnings; a user's still do.
- A module exported here trains in a separate JVM on the pytorch-native-cpu jar's libtorch and matches eager torch.
- gradbridge-spark's c10d Gloo exchange runs on this torch's libtorch.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from gradbridge import export_training_module, reference
from gradbridge._runtime import launcher, libtorch, torch_gate, torchscript
from gradbridge.commands import doctor
from gradbridge.parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL, assert_histories_match
from tests.models.custom import export_regressor

pytestmark = pytest.mark.every_torch

REPO_ROOT = Path(__file__).resolve().parents[1]
PINNED_TORCH = re.search(r"^torchVersion=(\S+)$", (REPO_ROOT / "gradle.properties").read_text(), re.MULTILINE).group(1)
RANGE_LINE = f"gradbridge supports {libtorch.supported()}: pip install '{libtorch.supported()}'"


def _lower_end():
    specifiers = {s.operator: Version(s.version) for s in Requirement(libtorch.supported()).specifier}
    assert list(specifiers) == [">="], f"{libtorch.supported()}: the range has a lower end only (pip keeps a newer torch)"
    return specifiers[">="]


def test_range_is_read_from_the_wheels_requirements():
    lines = [line.strip() for line in libtorch.REQUIREMENTS.read_text().splitlines()
             if line.strip().startswith("torch")]
    assert lines == [libtorch.supported()]
    assert "dependencies" in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dynamic"]


def test_the_range_starts_at_the_pinned_release_and_holds_this_torch():
    assert _lower_end() == Version(PINNED_TORCH)
    assert libtorch.in_range(libtorch.torch_version())
    verified = Version(libtorch.verified_up_to())
    newer = f"{verified.major}.{verified.minor + 1}.0"
    for version, inside, checked in [(PINNED_TORCH, True, True), ("2.15.0+cu132", True, True), ("2.7.0", False, False),
                                     (f"{verified}.9", True, True), (newer, True, False), ("3.0.0", True, False)]:
        assert libtorch.in_range(version) is inside, version
        assert libtorch.is_verified(version) is checked, version


def test_the_docs_name_the_range_and_the_verified_releases():
    guide = (REPO_ROOT / "docs" / "torch-versions.md").read_text()
    assert f"`{libtorch.supported()}`" in guide
    verified = libtorch.verified_up_to()
    assert f"verified up to {verified}.x" in guide.lower()
    assert f"verified up to {verified}.x" in (REPO_ROOT / "README.md").read_text().lower()
    # where the verdicts are kept, and how CI turns the automatic self-check off
    assert f"`~/.cache/gradbridge/{torch_gate.FOLDER}`" in guide and f"`{torch_gate.AUTO_ENV}=0`" in guide
    # the release table's last row is the verified minor release
    rows = re.findall(r"^\| (\d+\.\d+)\.\d+\+\w+ \|", guide, re.MULTILINE)
    assert rows and rows[-1] == verified, rows


def _gradbridge(args, cwd, torch_version=None):
    """`gradbridge ARGS` in a fresh process; with ``torch_version`` torch reports that version."""
    fake = f"import torch; torch.__version__ = {torch_version!r}; " if torch_version else ""
    code = f"import sys; {fake}from gradbridge.commands.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def regressor(tmp_path_factory):
    folder = tmp_path_factory.mktemp("range")
    return export_regressor(folder)


@pytest.mark.parametrize("outside", ["2.6.0+cpu", "2.7.0"])
@pytest.mark.parametrize("java", ["inprocess", "subprocess"])
def test_torch_outside_the_range_is_one_line_before_a_jvm_starts(regressor, tmp_path, outside, java):
    path, _, _ = regressor
    result = _gradbridge(["parity", path, "--data", path.parent / "train.npz", "--epochs", 1, "--java", java],
                         tmp_path, outside)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stdout + result.stderr
    assert lines[0] == f"gradbridge: error: torch {outside.split('+')[0]} is installed, but {RANGE_LINE}"
    assert not list(tmp_path.iterdir())


def test_doctor_names_the_range_for_a_torch_outside_it(tmp_path):
    result = _gradbridge(["doctor"], tmp_path, "2.6.0")
    problems = [line for line in result.stdout.splitlines() if line.startswith("problem: ")]
    assert result.returncode == 1 and problems == [f"problem: torch: torch 2.6.0 is installed, but {RANGE_LINE}"], \
        result.stdout


def test_in_process_java_runs_on_this_torch_bit_for_bit(regressor, tmp_path):
    """gradbridge's native library is built for the torch of this venv (either end of the range)."""
    path, _, _ = regressor
    result = _gradbridge(["parity", path, "--data", path.parent / "train.npz", "--epochs", 2, "--java", "inprocess"],
                         tmp_path, None)
    assert result.returncode == 0, result.stdout + result.stderr


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _torchscript_warnings(caught):
    return [f"{w.category.__name__}: {w.message}" for w in caught
            if issubclass(w.category, (FutureWarning, DeprecationWarning)) and "torch.jit" in str(w.message)]


def _torch_deprecates_torchscript() -> bool:
    """Whether this torch's own torch.jit.script warns: found by calling it (2.15.0 does)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.script(_double)
    deprecating = bool(_torchscript_warnings(caught))
    assert deprecating or Version(libtorch.torch_version()) < Version("2.15"), "2.15.0 deprecates TorchScript"
    return deprecating


def test_doctor_reports_torch_its_range_and_torchscripts_status():
    lines = []
    doctor.run(lines.append)
    rows = {line[:22].strip(): line[22:].strip() for line in lines if not line.startswith(("problem", "no problems"))}
    assert rows["torch"].startswith(f"{libtorch.torch_version()} (supported: {libtorch.supported()}; libtorch: ")
    if _torch_deprecates_torchscript():
        assert re.fullmatch(r"deprecated \((torch\.jit\.\w+, )*torch\.jit\.script warn: please switch to "
                            r"torch\.export\); gradbridge silences that warning for its own calls only",
                            rows["TorchScript"]), rows
    else:
        assert rows["TorchScript"] == "supported (torch.jit.script, save and load give no deprecation warning)"
    assert f"torch{libtorch.torch_version()}" in rows["native library"], rows
    # (and when `gradbridge verify` ran on this machine, when it passed); a newer torch: its self-check
    verified = f"verified (the project's matrix ran on every release up to {libtorch.verified_up_to()}.x)"
    assert rows["torch self-check"].startswith(
        verified if libtorch.is_verified(libtorch.torch_version()) else ("self-checked ", "not self-checked yet ")), rows


def test_exports_and_the_reference_print_no_torchscript_deprecation_warning(tmp_path, regressor):
    _, x, y = regressor
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = export_training_module(model, "mse", {"name": "sgd", "lr": 0.05, "momentum": 0.9}, tmp_path / "q.pt",
                                      example_inputs=(torch.from_numpy(x[:2]), torch.from_numpy(y[:2])))
        reference.train(path, x, y, epochs=1)
        torchscript.load_for_python(path).evaluate(torch.from_numpy(x), torch.from_numpy(y))
        warnings.warn("the user's own warning", FutureWarning)
    assert _torchscript_warnings(caught) == []
    assert "the user's own warning" in [str(w.message) for w in caught]
    # the user's own TorchScript calls, after gradbridge's, keep torch's warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.script(_double)
    assert bool(_torchscript_warnings(caught)) is _torch_deprecates_torchscript()


def test_a_module_exported_here_trains_in_a_jvm_on_the_jars_libtorch(regressor, tmp_path):
    """The separate JVM of a checkout runs the pytorch-native-cpu jar's libtorch (2.7.1), whatever this venv's
    torch is."""
    path, x, y = regressor
    java = launcher.train(path, path.parent / "train.npz", epochs=3, batch_size=16, seed=1, mode="step",
                          history=tmp_path / "h.jsonl")
    python = reference.train(path, x, y, epochs=3, batch_size=16, seed=1, mode="step")
    report = assert_histories_match(python, java, rtol=SEPARATE_JVM_RTOL, atol=SEPARATE_JVM_ATOL)
    print(f"torch {libtorch.torch_version()} vs the jar's libtorch {PINNED_TORCH}: "
          f"{'bitwise' if report.bitwise else f'max |dloss| {report.max_loss_delta:.2e}'}")


def test_the_core_native_library_carries_no_gloo():
    """c10d Gloo is gradbridge-spark's own library: the core library built for this torch neither
    defines nor needs a gloo symbol, and spark's defines its JNI entry points."""
    from gradbridge._runtime import native
    from tests.spark_support import gloo_symbols

    assert not gloo_symbols(native.ensure(quiet=True)), gloo_symbols(native.ensure(quiet=True))[:5]
    spark = gloo_symbols(native.ensure_gloo(quiet=True))
    assert any("Java_dev_gradbridge_spark_GlooNative_glooGroup" in line for line in spark), spark[:5]


def test_the_gloo_group_runs_on_this_torch(jvm):
    """gradbridge-spark's exchange (c10d Gloo inside this torch's libtorch, through spark's own Gloo
    library built for it): three ranks on threads of the JVM in this process, an all-to-all of unequal splits
    and an all-gather over 127.0.0.1."""
    from concurrent.futures import ThreadPoolExecutor

    import jpype

    from gradbridge._runtime import devtree as _devtree, native

    # gradbridge-spark's own classes and its Gloo library built for this torch (the core's carries no gloo)
    jpype.JClass("java.lang.System").setProperty("gradbridge.gloo.library", str(native.ensure_gloo(quiet=True)))
    spark_jar = next((_devtree.require_root("gradbridge-spark") / "spark" / "build" / "libs").glob("gradbridge-spark_2.13-*.jar"))
    url = jpype.JClass("java.net.URL")(spark_jar.as_uri())
    loader = jpype.JClass("java.net.URLClassLoader")([url], jpype.JClass("java.lang.ClassLoader").getSystemClassLoader())
    gloo = jpype.JClass("dev.gradbridge.spark.GlooGroup", loader=loader)
    duration = jpype.JClass("java.time.Duration").ofSeconds(30)
    direct = jpype.JClass("java.nio.ByteBuffer").allocateDirect
    nothing = jpype.JProxy("java.lang.Runnable", dict={"run": lambda: None})
    server = gloo.Store.serve(duration)
    port = server.port()

    def rank(r):
        store = server if r == 0 else gloo.Store.connect("127.0.0.1", port, duration)
        group = gloo.join(store, "test", "127.0.0.1", r, 3, duration)
        send = direct(3 * (r + 1))
        for to in range(3):
            for _ in range(r + 1):
                send.put(jpype.JByte(10 * r + to))
        receive = direct(6)
        group.alltoall(send, [r + 1] * 3, receive, [1, 2, 3], nothing)
        gathered = direct(3)
        group.allgather(direct(1).put(jpype.JByte(r)), gathered, 1, nothing)
        group.close()
        if r:
            store.close()
        return [receive.get(i) for i in range(6)], [gathered.get(i) for i in range(3)]

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(rank, range(3)))
    server.close()
    for r, (received, gathered) in enumerate(results):
        assert received == [r, 10 + r, 10 + r, 20 + r, 20 + r, 20 + r]
        assert gathered == [0, 1, 2]
