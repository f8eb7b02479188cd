"""gradbridge in a user's own project, run from outside the checkout with the README's commands.

- Python: `make dist` builds the wheel; it is installed with plain pip into a fresh venv, and
  the README walkthrough, `gradbridge doctor`, `demo`, `parity --java both` and the pytest
  project in examples/python-project run there, in folders outside the checkout.
- Java: `gradle publishToMavenLocal` publishes dev.gradbridge:gradbridge; examples/java-app, a
  Gradle project of its own, trains with it through `gradle run`, compared with the reference.

The fresh venv gets torch, numpy, JPype and the rest through a .pth file naming a folder of
links to this venv's third-party packages (without gradbridge, pip and setuptools): pip then
resolves the wheel's dependencies against them instead of downloading 5 GB again. gradbridge
itself comes only from the wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest

import gradbridge
from gradbridge import History, reference
from gradbridge._runtime import libtorch, native
from gradbridge._runtime.devtree import root
from gradbridge.parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL, assert_histories_match
from tests.spark_support import gloo_symbols

REPO_ROOT = root()
VERSION = gradbridge.__version__
WHEEL = REPO_ROOT / "dist" / f"gradbridge-{VERSION}-py3-none-any.whl"
M2 = Path.home() / ".m2" / "repository" / "dev" / "gradbridge" / "gradbridge" / VERSION
# Not linked into the fresh venv: what the wheel must bring, and the venv's own tools.
_NOT_LINKED = re.compile(r"^(gradbridge|__editable__|_?_?editable__|pip|setuptools|_distutils_hack|pkg_resources|"
                         r"__pycache__)|\.pth$")

pytestmark = pytest.mark.gradle


def _run(command, cwd, env=None, timeout=600):
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def wheel():
    result = _run(["make", "-s", "dist"], cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert WHEEL.is_file(), sorted(p.name for p in WHEEL.parent.iterdir())
    return WHEEL


def _fresh_env(wheel: Path, base: Path, third_party: Path):
    """A fresh venv whose third-party packages are those of ``third_party`` (a site-packages), with
    the wheel installed by pip; returns (bin folder, environment for commands, pip's output)."""
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    deps = base / "third-party"
    deps.mkdir()
    for entry in third_party.iterdir():
        if not _NOT_LINKED.search(entry.name):
            (deps / entry.name).symlink_to(entry)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "third_party.pth").write_text(f"{deps}\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GRADBRIDGE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    result = _run([venv / "bin" / "python", "-m", "pip", "install", "--no-input", wheel], cwd=base, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return venv / "bin", env, result.stdout


@pytest.fixture(scope="session")
def user_env(wheel, tmp_path_factory):
    """A fresh venv (this venv's torch) with the wheel installed by pip; returns (bin folder, environment)."""
    bin_dir, env, _ = _fresh_env(wheel, tmp_path_factory.mktemp("user-env"), Path(sysconfig.get_paths()["purelib"]))
    return bin_dir, env


@pytest.fixture(scope="session")
def newest_torch():
    """The newest torch pip finds (`make newest`'s venv): (its site-packages, its version)."""
    result = _run(["make", "-s", "newest"], cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    probe = _run([REPO_ROOT / ".venv-newest" / "bin" / "python", "-c",
                  "import sysconfig, torch; print(sysconfig.get_paths()['purelib']); print(torch.__version__)"],
                 cwd=REPO_ROOT)
    assert probe.returncode == 0, probe.stderr
    purelib, torch_version = probe.stdout.split()
    from packaging.version import Version

    verified = Version(libtorch.verified_up_to())
    assert Version(torch_version).release[:2] >= verified.release, \
        f".venv-newest holds torch {torch_version}, older than the verified {verified}.x"
    return Path(purelib), torch_version


@pytest.fixture(scope="session")
def newest_user_env(wheel, newest_torch, tmp_path_factory):
    """A fresh venv that already has the newest torch (`make newest`'s), then the wheel: returns (bin
    folder, environment, pip's output, that torch's version)."""
    purelib, torch_version = newest_torch
    bin_dir, env, pip_output = _fresh_env(wheel, tmp_path_factory.mktemp("newest-user-env"), purelib)
    return bin_dir, env, pip_output, torch_version


@pytest.fixture
def outside(tmp_path):
    """A working folder outside the checkout."""
    assert REPO_ROOT not in tmp_path.parents
    return tmp_path


# ---- the wheel ----

def test_wheel_carries_the_java_library_and_the_version(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        listed = archive.read("gradbridge/jars/classpath.txt").decode().split()
        with archive.open(f"gradbridge/jars/gradbridge-{VERSION}.jar") as jar_file:
            jar_bytes = jar_file.read()
        metadata = archive.read(f"gradbridge-{VERSION}.dist-info/METADATA").decode()
    assert listed[0] == f"gradbridge-{VERSION}.jar"
    assert {f"gradbridge/jars/{name}" for name in listed} <= set(names)
    assert not [n for n in names if "pytorch-native" in n], "the wheel must not carry the libtorch jar"
    # the native library for the torch the wheel was built with, and its sources for any other torch
    assert [n for n in names if re.fullmatch(r"gradbridge/native_lib/libgradbridge_jni-torch[\d.]+-cxx11abi1\.so", n)]
    assert {f"gradbridge/native_lib/{name}" for name in (*native.CORE_FILES, "dev_gradbridge_Native.h")} <= set(names)
    # no gloo: c10d Gloo, its source and headers are gradbridge-spark's own library, not the core's
    assert not [n for n in names if "gloo" in n.lower()], [n for n in names if "gloo" in n.lower()]
    with zipfile.ZipFile(wheel) as archive:
        libraries = {n: archive.read(n) for n in names if n.startswith("gradbridge/native_lib/") and n.endswith(".so")}
    assert libraries
    for name, content in libraries.items():
        copy = wheel.parent / "inspect.so"
        copy.write_bytes(content)
        try:
            assert not gloo_symbols(copy), (name, gloo_symbols(copy)[:5])
        finally:
            copy.unlink()
    # no DJL code: neither its engine, its JNI library nor its API
    assert not [n for n in names if n.startswith(("gradbridge/jars/pytorch-jni-", "gradbridge/jars/pytorch-engine-",
                                                   "gradbridge/jars/api-0."))], names
    assert f"\nVersion: {VERSION}\n" in metadata
    from packaging.requirements import Requirement

    required = [Requirement(line.split(": ", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    torch_pins = [r for r in required if r.name == "torch"]
    assert [r.specifier for r in torch_pins] == [Requirement(libtorch.supported()).specifier], torch_pins
    # a lower end only: pip neither refuses nor downgrades a torch newer than the verified releases
    assert [s.operator for s in torch_pins[0].specifier] == [">="], torch_pins
    assert "gradbridge/VERIFIED_TORCH" in names
    jar_path = wheel.parent / "inspect.jar"
    jar_path.write_bytes(jar_bytes)
    try:
        with zipfile.ZipFile(jar_path) as jar:
            assert f"Implementation-Version: {VERSION}" in jar.read("META-INF/MANIFEST.MF").decode()
            assert f"gradbridge={VERSION}" in jar.read("dev/gradbridge/versions.properties").decode()
            assert "simplelogger.properties" not in jar.namelist()
    finally:
        jar_path.unlink()


def test_installed_package_comes_from_the_wheel(user_env, outside):
    bin_dir, env = user_env
    result = _run([bin_dir / "python", "-c", "import gradbridge, sys; print(gradbridge.__file__); "
                   "print(gradbridge.__version__); print('torch' in sys.modules)"], cwd=outside, env=env)
    assert result.returncode == 0, result.stderr
    location, version, torch_loaded = result.stdout.split()
    assert REPO_ROOT not in Path(location).parents and Path(bin_dir.parent) in Path(location).parents
    assert version == VERSION and torch_loaded == "False"


def test_doctor_reports_the_installation(user_env, outside):
    bin_dir, env = user_env
    result = _run([bin_dir / "gradbridge", "doctor"], cwd=outside, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "installed package" in result.stdout and "no problems found" in result.stdout
    assert re.search(r"JVM start +ok \(Java \d+", result.stdout), result.stdout
    assert "from the jars of the installed package" in result.stdout
    assert "a separate JVM runs this Python's libtorch" in result.stdout


def _readme_block(marker: str) -> str:
    text = (REPO_ROOT / "README.md").read_text()
    after = text[text.index(marker):]
    return re.search(r"```bash\n(.*?)```", after, re.DOTALL).group(1)


def test_readme_parity_walkthrough_runs_anywhere(user_env, outside):
    bin_dir, env = user_env
    script = _readme_block("<!-- walkthrough")
    result = _run(["bash", "-euo", "pipefail", "-c", script], cwd=outside, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "java: bitwise identical over 5 epochs" in result.stdout
    assert re.search(r"java-subprocess: (bitwise identical|within tolerance)", result.stdout), result.stdout
    assert (outside / "parity.json").is_file() and (outside / "parity.png").is_file()


def test_demo_runs_from_the_install(user_env, outside):
    bin_dir, env = user_env
    result = _run([bin_dir / "gradbridge", "demo", "--epochs", 50], cwd=outside, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "java: bitwise identical over 50 epochs" in result.stdout
    assert not (outside / ".gradle").exists()


def test_online_service_runs_from_the_install(user_env, outside, models):
    """`gradbridge serve` on the wheel's jars: token by default, feedback, SIGTERM, then replay."""
    import json
    import signal
    import urllib.request

    bin_dir, env = user_env
    log_dir = outside / "log"
    process = subprocess.Popen([str(bin_dir / "gradbridge"), "serve", "--model", str(models["mlp_classifier.pt"]),
                                "--log", str(log_dir), "--port", "0", "--fsync", "never"], cwd=outside, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("gradbridge-serve: listening on http://127.0.0.1:"), line + process.stderr.read()
        url = line.split()[3]
        assert "Authorization: Bearer TOKEN" in process.stdout.readline()
        token = (log_dir / "serve.key").read_text().strip()
        request = urllib.request.Request(url + "/feedback", method="POST", data=json.dumps(
            {"x": [[0.1, 0.2, 0.3, 0.4]] * 3, "y": [0, 1, 2]}).encode(), headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["accepted"] == 3
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    finally:
        if process.poll() is None:
            process.kill()
    result = _run([bin_dir / "gradbridge", "replay", "--log", log_dir, "--model", models["mlp_classifier.pt"]],
                  cwd=outside, env=env)
    assert result.returncode == 0 and "bitwise identical" in result.stdout, result.stdout + result.stderr


def test_python_project_tests_pass_with_the_plugin(user_env, tmp_path):
    bin_dir, env = user_env
    project = tmp_path / "python-project"
    shutil.copytree(REPO_ROOT / "examples" / "python-project", project)
    result = _run([bin_dir / "python", "-m", "pytest", "-q"], cwd=project, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_parity_both_keeps_the_in_process_result_when_the_subprocess_fails(user_env, outside):
    """An old `java` for the separate JVM; the in-process JVM (GRADBRIDGE_JVM) still works."""
    bin_dir, env = user_env
    old_jdk = _fake_old_jdk(outside)
    _write_regressor(outside, bin_dir, env)
    env = {**env, "JAVA_HOME": str(old_jdk), "GRADBRIDGE_JVM": _libjvm()}
    result = _run([bin_dir / "gradbridge", "parity", "m.pt", "--data", "train.npz", "--epochs", 2, "--java", "both",
                   "--report", "r.json"], cwd=outside, env=env)
    assert result.returncode == 1
    assert "java: bitwise identical over 2 epochs" in result.stdout
    error_lines = result.stderr.strip().splitlines()
    assert len(error_lines) == 1, result.stderr
    assert re.match(r"gradbridge: error: java-subprocess: .*is Java 11\.0\.2; gradbridge needs Java 17 or newer",
                    error_lines[0]), error_lines[0]
    assert "java-subprocess" in (outside / "r.json").read_text()


def test_users_own_java_class_runs_beside_the_installed_library(user_env, outside):
    """A user class compiled against the wheel's gradbridge jar, on GRADBRIDGE_USER_CLASSPATH."""
    from tests.user_code import CALL, USER_CLASS

    bin_dir, env = user_env
    jars = next(Path(bin_dir.parent).glob("lib/python3*/site-packages/gradbridge/jars"))
    source = outside / "src" / "my" / "project" / "Thing.java"
    source.parent.mkdir(parents=True)
    source.write_text(USER_CLASS)
    from gradbridge._runtime import jdk

    javac = Path(jdk.java_executable()).with_name("javac")
    compiled = _run([javac, "-d", outside / "classes", "-cp", jars / f"gradbridge-{VERSION}.jar", source],
                    cwd=outside)
    assert compiled.returncode == 0, compiled.stderr
    result = _run([bin_dir / "python", "-c", f"from gradbridge import jvm; jvm.start(); {CALL}"], cwd=outside,
                  env={**env, "GRADBRIDGE_USER_CLASSPATH": str(outside / "classes")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().startswith("hello python, protocol methods: "), result.stdout


_USER_TRANSFORMER = """\
import numpy as np, torch, transformers
from gradbridge import export_training_module


class Classifier(torch.nn.Module):  # what a user writes around an HF model: logits for the loss
    def __init__(self):
        super().__init__()
        config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=37, vocab_size=50, max_position_embeddings=16, num_labels=3)
        self.bert = transformers.BertForSequenceClassification(config)

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).logits


def make():
    torch.manual_seed(0)
    return Classifier()


if __name__ == "__main__":
    g = np.random.default_rng(0)
    ids = g.integers(3, 50, size=(12, 8)).astype("int64")
    mask = (np.arange(8) < g.integers(4, 9, size=(12, 1))).astype("int64")
    y = g.integers(0, 3, size=12).astype("int64")
    np.savez("train.npz", input_ids=ids, attention_mask=mask, y=y)
    model = make()
    example = ({"input_ids": torch.from_numpy(ids[:4]), "attention_mask": torch.from_numpy(mask[:4])},
               torch.from_numpy(y[:4]))
    export_training_module(model, "cross_entropy", {"name": "adamw", "lr": 1e-3}, "bert.pt", example_inputs=example,
                           format="export")
"""


@pytest.mark.slow  # CI's time: --full (one fast case of its kind stays in the default run)
def test_protocol_3_trains_a_transformers_model_from_the_install(user_env, outside):
    """An HF model with its attention mask, captured with torch.export from the installed wheel: Java in
    this process and in a JVM of its own (this Python's libtorch) against the user's own eager model."""
    bin_dir, env = user_env
    (outside / "my_model.py").write_text(_USER_TRANSFORMER)
    exported = _run([bin_dir / "python", "my_model.py"], cwd=outside, env=env)
    assert exported.returncode == 0, exported.stderr
    result = _run([bin_dir / "gradbridge", "parity", "bert.pt", "--data", "train.npz", "--epochs", 2, "--batch-size", 4,
                   "--java", "both", "--model-factory", "my_model:make"], cwd=outside, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "java: bitwise identical over 2 epochs" in result.stdout, result.stdout
    assert "java-subprocess: bitwise identical over 2 epochs" in result.stdout, result.stdout
    # ... and its weights go back into the user's model as safetensors (the wheel's own dependency)
    written = _run([bin_dir / "gradbridge", "state-dict", "bert.pt", "-o", "bert.safetensors"], cwd=outside, env=env)
    assert written.stdout == "wrote bert.safetensors\n", written.stdout + written.stderr
    loaded = _run([bin_dir / "python", "-c", _LOAD_SAFETENSORS], cwd=outside, env=env)
    assert loaded.returncode == 0, loaded.stderr


_LOAD_SAFETENSORS = """\
import torch, my_model
from safetensors.torch import load_file
state = load_file("bert.safetensors")
model = my_model.make()
model.load_state_dict(state)  # strict: the model's own keys, no other
assert all(torch.equal(state[k], v) for k, v in my_model.make().state_dict().items())
"""


# ---- bad installations: one line naming the fix, exit code 1 ----

def _fake_old_jdk(where: Path) -> Path:
    home = where / "old-jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\nexit 0\n')
    java.chmod(0o755)
    return home


def _libjvm() -> str:
    import jpype

    return jpype.getDefaultJVMPath()


def _write_regressor(folder: Path, bin_dir: Path, env: dict) -> None:
    script = ("import numpy as np, torch\n"
              "from gradbridge import export_training_module\n"
              "torch.manual_seed(0)\n"
              "m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))\n"
              "x = np.random.default_rng(0).normal(size=(32, 3)).astype('float32')\n"
              "y = x.sum(1, keepdims=True).astype('float32')\n"
              "np.savez('train.npz', x=x, y=y)\n"
              "export_training_module(m, 'mse', {'name': 'sgd', 'lr': 0.05}, 'm.pt',"
              " example_inputs=(torch.from_numpy(x[:2]), torch.from_numpy(y[:2])))\n")
    result = _run([bin_dir / "python", "-c", script], cwd=folder, env=env)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", ["no_jars", "missing_jar", "old_java", "bogus_java_home", "other_torch"])
def test_bad_installation_is_one_line(user_env, outside, case):
    bin_dir, env = user_env
    _write_regressor(outside, bin_dir, env)
    command = [bin_dir / "gradbridge", "parity", "m.pt", "--data", "train.npz", "--epochs", 1]
    if case == "no_jars":       # a wheel without its jars: a copy of the package without jars/
        package = outside / "pkg" / "gradbridge"
        shutil.copytree(Path(bin_dir.parent).glob("lib/python3*/site-packages/gradbridge").__next__(), package,
                        ignore=shutil.ignore_patterns("jars"))
        env = {**env, "PYTHONPATH": str(package.parent)}
        expected = r"this gradbridge install has no Java library: .*jars/classpath\.txt is missing; reinstall gradbridge"
    elif case == "missing_jar":
        env = {**env, "GRADBRIDGE_CLASSPATH": f"{outside / 'gone.jar'}"}
        expected = r"GRADBRIDGE_CLASSPATH names files that do not exist: .*gone\.jar; correct or unset"
    elif case == "old_java":
        env = {**env, "JAVA_HOME": str(_fake_old_jdk(outside))}
        command[-2:] = ["--java", "subprocess", "--epochs", 1]
        expected = r"is Java 11\.0\.2; gradbridge needs Java 17 or newer: install a JDK 17\+ and set JAVA_HOME"
    elif case == "bogus_java_home":  # refused, never passed over for the system's java
        env = {**env, "JAVA_HOME": str(outside / "no-jdk")}
        command[-2:] = ["--java", "both", "--epochs", 1]
        expected = r"JAVA_HOME=.*no-jdk holds no bin/java: point it at a JDK 17\+ or unset it"
    else:                       # torch's version seen as a release outside the range
        command = [bin_dir / "python", "-c", "import sys, torch; torch.__version__ = '2.6.0+cpu'; "
                   "from gradbridge.commands.main import main; sys.exit(main(sys.argv[1:]))", *command[1:]]
        expected = (rf"torch 2\.6\.0 is installed, but gradbridge supports {re.escape(libtorch.supported())}: "
                    rf"pip install '{re.escape(libtorch.supported())}'")
    result = _run(command, cwd=outside, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stdout + result.stderr
    assert lines[0].startswith("gradbridge: error: ") and re.search(expected, lines[0]), lines[0]
    if case != "other_torch":
        doctor = _run([bin_dir / "gradbridge", "doctor"], cwd=outside, env=env)
        problems = [line for line in doctor.stdout.splitlines() if line.startswith("problem: ")]
        # a JAVA_HOME serves both JVMs: the one in this process and the separate one may both name it
        assert doctor.returncode == 1 and 1 <= len(problems) <= (2 if "java" in case else 1), doctor.stdout
        assert re.search(expected, problems[-1]), doctor.stdout


@pytest.mark.parametrize("options, expected", [
    ("-Xmx1k", "Error occurred during initialization of VM; Too small maximum heap"),
    ("-Xbogus", "Unrecognized option: -Xbogus"),
])
def test_doctor_starts_a_jvm_with_the_users_jvm_options(user_env, outside, options, expected):
    # Given JVM options with which every in-process JVM command would die of the JVM's own lines
    bin_dir, env = user_env
    doctor = _run([bin_dir / "gradbridge", "doctor"], cwd=outside, env={**env, "GRADBRIDGE_JVM_OPTIONS": options})
    # Then doctor starts a JVM as the commands do, in a process of its own, and says so
    problems = [line for line in doctor.stdout.splitlines() if line.startswith("problem: ")]
    assert doctor.returncode == 1 and len(problems) == 1, doctor.stdout
    assert problems[0].startswith(f"problem: JVM start: a JVM does not start with GRADBRIDGE_JVM_OPTIONS={options}: "
                                  f"{expected}"), problems[0]
    assert problems[0].endswith("; correct or unset GRADBRIDGE_JVM_OPTIONS"), problems[0]


# ---- the wheel in a project that already has the newest torch of the range ----

def test_wheel_keeps_the_users_newer_torch_and_doctor_reports_it(newest_user_env, outside):
    bin_dir, env, pip_output, newest = newest_user_env
    assert "torch" not in pip_output.split("Successfully installed")[-1].lower(), pip_output
    version = _run([bin_dir / "python", "-c", "import torch; print(torch.__version__)"], cwd=outside, env=env)
    assert version.stdout.strip() == newest
    doctor = _run([bin_dir / "gradbridge", "doctor"], cwd=outside, env=env)
    rows = {line[:22].strip(): line[22:].strip() for line in doctor.stdout.splitlines()}
    assert rows["torch"].startswith(f"{newest.split('+')[0]} (supported: {libtorch.supported()}; "), doctor.stdout
    assert rows["TorchScript"].startswith("deprecated (torch.jit.load, torch.jit.save, torch.jit.script warn"), rows
    # the wheel's prebuilt native library is for the torch it was built with: this one is built on first use
    assert "native library" in rows, doctor.stdout
    assert doctor.returncode == 0 and "no problems found" in doctor.stdout, doctor.stdout


def test_python_half_runs_on_the_newest_torch_without_deprecation_warnings(newest_user_env, outside):
    """Export and the reference from the installed wheel, with torch's FutureWarnings made errors."""
    bin_dir, env, _, _ = newest_user_env
    _write_regressor(outside, bin_dir, {**env, "PYTHONWARNINGS": "error::FutureWarning,error::DeprecationWarning"})
    script = ("import numpy as np\nfrom gradbridge import reference\nd = np.load('train.npz')\n"
              "h = reference.train('m.pt', d['x'], d['y'], epochs=3)\nprint(len(h.records))\n")
    result = _run([bin_dir / "python", "-W", "error::FutureWarning", "-c", script], cwd=outside, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "3", result.stdout + result.stderr
    # Java in this process, on this torch: the native library is compiled once for it, then parity is bitwise
    parity = _run([bin_dir / "gradbridge", "parity", "m.pt", "--data", "train.npz", "--epochs", 2,
                   "--java", "inprocess"], cwd=outside, env=env)
    assert parity.returncode == 0, parity.stdout + parity.stderr
    assert "bitwise" in parity.stdout.lower() or "identical" in parity.stdout.lower(), parity.stdout


_USER_TWO_INPUTS = """\
import numpy as np, torch
from gradbridge import export_training_module


class Scorer(torch.nn.Module):  # two named inputs and dropout: what TorchScript's path does not take
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.drop = torch.nn.Dropout(0.2)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, ids, mask):
        pooled = (self.embed(ids) * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(self.drop(pooled))


def make():
    torch.manual_seed(0)
    return Scorer()


if __name__ == "__main__":
    g = np.random.default_rng(0)
    ids = g.integers(0, 20, size=(16, 6)).astype("int64")
    mask = (np.arange(6) < g.integers(2, 7, size=(16, 1))).astype("float32")
    y = g.integers(0, 3, size=16).astype("int64")
    np.savez("train.npz", ids=ids, mask=mask, y=y)
    example = ({"ids": torch.from_numpy(ids[:4]), "mask": torch.from_numpy(mask[:4])}, torch.from_numpy(y[:4]))
    export_training_module(make(), "cross_entropy", {"name": "adam", "lr": 1e-2}, "scorer.pt",
                           example_inputs=example, format="export")
"""


def test_protocol_3_from_the_wheel_on_the_newest_torch(newest_user_env, outside):
    """torch.export's capture from the installed wheel on the newest torch of the range (the native library
    compiled for it on first use): Java in this process and in a JVM of its own equal the user's own eager
    module, dropout and two named inputs included."""
    bin_dir, env, _, _ = newest_user_env
    (outside / "my_model.py").write_text(_USER_TWO_INPUTS)
    exported = _run([bin_dir / "python", "my_model.py"], cwd=outside, env=env)
    assert exported.returncode == 0, exported.stderr
    result = _run([bin_dir / "gradbridge", "parity", "scorer.pt", "--data", "train.npz", "--epochs", 2,
                   "--batch-size", 4, "--java", "both", "--model-factory", "my_model:make"], cwd=outside, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "java: bitwise identical over 2 epochs" in result.stdout, result.stdout
    assert "java-subprocess: bitwise identical over 2 epochs" in result.stdout, result.stdout


@pytest.mark.slow  # CI's time: --full (one fast case of its kind stays in the default run)
def test_release_day_a_torch_newer_than_the_wheels_mark_is_self_checked_once(wheel, newest_torch, tmp_path_factory):
    """The wheel with "verified up to" below the newest torch (as if that torch came out after the wheel):
    pip keeps that torch; the first in-process training runs `gradbridge verify` from the installed wheel
    once and is bitwise; the next process reuses the verdict; doctor reports it."""
    from packaging.version import Version

    purelib, newest = newest_torch
    base = tmp_path_factory.mktemp("release-day")
    bin_dir, env, pip_output = _fresh_env(wheel, base, purelib)
    assert "torch" not in pip_output.split("Successfully installed")[-1].lower(), pip_output
    release = Version(libtorch.release(newest))
    next(base.glob("venv/lib/python3*/site-packages/gradbridge/VERIFIED_TORCH")).write_text(
        f"{release.major}.{release.minor - 1}\n")
    cache = base / "cache"  # verdicts of this test only; the native libraries already built are shared
    cache.mkdir()
    from gradbridge._runtime.native import cache_dir

    (cache_dir() / "native").mkdir(parents=True, exist_ok=True)
    (cache / "native").symlink_to(cache_dir() / "native")
    env = {**env, "GRADBRIDGE_CACHE_DIR": str(cache)}
    work = base / "work"
    work.mkdir()
    _write_regressor(work, bin_dir, env)
    parity = [bin_dir / "gradbridge", "parity", "m.pt", "--data", "train.npz", "--epochs", 2, "--java", "inprocess"]
    first, second = _run(parity, cwd=work, env=env), _run(parity, cwd=work, env=env)
    for result in (first, second):
        assert result.returncode == 0 and "java: bitwise identical over 2 epochs" in result.stdout, \
            result.stdout + result.stderr
    assert first.stderr.count("checking it once on this machine") == 1, first.stderr
    assert re.search(r"^passed in \d+ s; verdict recorded in ", first.stderr, re.MULTILINE), first.stderr
    assert "gradbridge verify" not in second.stderr, second.stderr
    doctor = _run([bin_dir / "gradbridge", "doctor"], cwd=work, env=env)
    rows = {line[:22].strip(): line[22:].strip() for line in doctor.stdout.splitlines()}
    assert rows["torch self-check"].startswith("self-checked on this machine"), doctor.stdout
    assert doctor.returncode == 0, doctor.stdout


# ---- the Maven artifact and a Gradle application that uses it ----

@pytest.fixture(scope="session")
def published():
    result = _run(["gradle", "--no-daemon", "-q", "publishToMavenLocal"], cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return M2


def test_published_pom_declares_no_djl_code_and_libtorch_at_run_time(published):
    pom = ElementTree.parse(published / f"gradbridge-{VERSION}.pom").getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    assert pom.findtext("m:version", namespaces=ns) == VERSION
    deps = {(d.findtext("m:artifactId", namespaces=ns), d.findtext("m:classifier", namespaces=ns)):
            d.findtext("m:scope", namespaces=ns) for d in pom.iterfind("m:dependencies/m:dependency", ns)}
    assert not {"api", "pytorch-engine", "pytorch-jni"} & {artifact for artifact, _ in deps}, deps
    assert deps[("pytorch-native-cpu", "linux-x86_64")] == "runtime"  # libtorch's shared libraries only
    assert not [artifact for artifact, _ in deps if artifact.startswith("slf4j-simple")]
    # the library alone: its programs (picocli) are gradbridge-programs; the progress bar is optional
    assert not {"picocli", "gradbridge-programs"} & {artifact for artifact, _ in deps}, deps
    optional = {d.findtext("m:artifactId", namespaces=ns) for d in pom.iterfind("m:dependencies/m:dependency", ns)
                if d.findtext("m:optional", namespaces=ns) == "true"}
    assert optional == {"progressbar"}, optional
    with zipfile.ZipFile(published / f"gradbridge-{VERSION}.jar") as jar:
        programs = [n for n in jar.namelist() if n.startswith(("dev/gradbridge/cli/", "dev/gradbridge/examples/",
                                                               "dev/gradbridge/bench/"))]
    assert not programs, programs
    assert not list(published.glob("*.asc")), "signing is off unless -PsignMaven=true"
    for suffix in ("sources", "javadoc"):
        with zipfile.ZipFile(published / f"gradbridge-{VERSION}-{suffix}.jar") as jar:
            assert any(n.endswith("TrainingModule." + ("java" if suffix == "sources" else "html")) for n in jar.namelist())


def _gradle_properties() -> dict:
    return dict(re.findall(r"^(\w+)=(.+)$", (REPO_ROOT / "gradle.properties").read_text(), flags=re.MULTILINE))


def test_wheel_and_pom_name_the_same_license_url_scm_and_developers(wheel, published):
    """What Maven Central and a legal review look for, the same in both artifacts."""
    props = _gradle_properties()
    pom = ElementTree.parse(published / f"gradbridge-{VERSION}.pom").getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    assert pom.findtext("m:url", namespaces=ns) == props["projectUrl"]
    assert pom.findtext("m:licenses/m:license/m:name", namespaces=ns) == props["licenseName"] == "Apache-2.0"
    assert pom.findtext("m:licenses/m:license/m:url", namespaces=ns) == props["licenseUrl"]
    assert pom.findtext("m:scm/m:url", namespaces=ns) == props["projectUrl"]
    assert pom.findtext("m:scm/m:connection", namespaces=ns) == props["scmConnection"]
    assert pom.findtext("m:developers/m:developer/m:name", namespaces=ns) == props["developerName"]
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"gradbridge-{VERSION}.dist-info/METADATA").decode()
        license_text = archive.read(f"gradbridge-{VERSION}.dist-info/licenses/LICENSE").decode()
    assert f"\nLicense-Expression: {props['licenseName']}\n" in metadata
    assert "\nLicense-File: LICENSE\n" in metadata
    assert f"\nAuthor: {props['developerName']}\n" in metadata
    assert f"\nProject-URL: Source, {props['projectUrl']}\n" in metadata
    assert license_text == (REPO_ROOT / "LICENSE").read_text() and "Apache License" in license_text


def test_signed_publication_with_a_key_given_as_properties(tmp_path):
    """-PsignMaven=true signs the jar, sources, javadoc and POM (gpg verifies each .asc)."""
    gnupg = tmp_path / "gnupg"
    gnupg.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    made = _run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "gradbridge test <test@example.invalid>",
                 "rsa2048", "sign", "never"], cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    listing = _run(["gpg", "--list-keys", "--with-colons"], cwd=tmp_path, env=env).stdout
    key_id = next(line.split(":")[4][-8:] for line in listing.splitlines() if line.startswith("pub:"))
    keyring = tmp_path / "secret.gpg"
    exported = subprocess.run(["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
                               "--export-secret-keys"], env=env, capture_output=True)
    keyring.write_bytes(exported.stdout)
    repository = tmp_path / "m2"
    try:
        result = _run(["gradle", "--no-daemon", "-q", "publishToMavenLocal", f"-Dmaven.repo.local={repository}",
                       "-PsignMaven=true", f"-Psigning.keyId={key_id}", "-Psigning.password=",
                       f"-Psigning.secretKeyRingFile={keyring}"], cwd=REPO_ROOT)
        assert result.returncode == 0, result.stdout + result.stderr
        folder = repository / "dev" / "gradbridge" / "gradbridge" / VERSION
        signed = sorted(p.name for p in folder.glob("*.asc"))
        assert signed == sorted(f"gradbridge-{VERSION}{part}.asc"
                                for part in (".jar", "-sources.jar", "-javadoc.jar", ".pom"))
        for signature in folder.glob("*.asc"):
            verified = _run(["gpg", "--verify", signature, signature.with_suffix("")], cwd=tmp_path, env=env)
            assert verified.returncode == 0 and "Good signature" in verified.stderr, verified.stderr
    finally:  # the agent gpg started for this keyring
        _run(["gpgconf", "--kill", "gpg-agent"], cwd=tmp_path, env=env)


def test_the_service_is_published_beside_the_library(published):
    pom = published.parent.parent / "gradbridge-serve" / VERSION / f"gradbridge-serve-{VERSION}.pom"
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    deps = {d.findtext("m:artifactId", namespaces=ns): d.findtext("m:version", namespaces=ns)
            for d in ElementTree.parse(pom).getroot().iterfind("m:dependencies/m:dependency", ns)}
    assert deps["gradbridge"] == VERSION and deps["javalin"].startswith("7."), deps


def test_java_app_trains_with_the_published_artifact(published, models, tmp_path):
    app = tmp_path / "java-app"
    shutil.copytree(REPO_ROOT / "examples" / "java-app", app)
    default = re.search(r"findProperty\('gradbridgeVersion'\) \?: '([^']+)'", (app / "build.gradle").read_text())
    assert default and default.group(1) == VERSION, "examples/java-app must default to the project version"
    rng = np.random.default_rng(3)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    y = (x @ np.array([[0.5], [1.0], [-1.0], [0.2]])).astype(np.float32)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    model = models["mlp_regressor.pt"]
    result = _run(["gradle", "--no-daemon", "-q", "run",
                   f"-Pargs={model} {tmp_path / 'train.npz'} 3 {tmp_path / 'history.jsonl'}"], cwd=app)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trained 3 epochs" in result.stdout
    java = History.load(tmp_path / "history.jsonl")
    python = reference.train(model, x, y, epochs=3, batch_size=16, seed=1, mode="step")
    assert_histories_match(python, java, rtol=SEPARATE_JVM_RTOL, atol=SEPARATE_JVM_ATOL)


def test_readme_and_docs_name_the_project_version():
    readme = (REPO_ROOT / "README.md").read_text()
    guides = "".join(path.read_text() for path in sorted((REPO_ROOT / "docs").glob("*.md")))
    for text in (readme, readme + guides):
        assert set(re.findall(r"gradbridge-(\d+\.\d+\.\d+)-py3", text)) == {VERSION}
        assert set(re.findall(r"dev\.gradbridge:gradbridge:(\d+\.\d+\.\d+)", text)) == {VERSION}


def test_separate_jvm_runs_offline_on_the_wheels_jars_and_the_override_wins(user_env, outside):
    bin_dir, env = user_env
    probe = ("from gradbridge._runtime import classpath, launcher\n"
             "print(classpath.resolve().source)\n"
             "print(' '.join(launcher.command(launcher.TRAIN_MAIN, ['--help'])))\n")
    result = _run([bin_dir / "python", "-c", probe], cwd=outside, env=env)
    assert result.returncode == 0, result.stderr
    source, command = result.stdout.splitlines()
    assert source.startswith("the jars of the installed package")
    assert "-Dgradbridge.native.library=" in command and "-Dgradbridge.libtorch.path=" in command
    assert "pytorch-native" not in command
    jars = command.split(" -cp ")[1].split()[0]
    assert all(Path(jar).parent.parent.parent.name == "site-packages" and Path(bin_dir.parent) in Path(jar).parents
               for jar in jars.split(os.pathsep)), jars
    overridden = _run([bin_dir / "python", "-c", probe], cwd=outside, env={**env, "GRADBRIDGE_CLASSPATH": jars})
    assert overridden.stdout.splitlines()[0] == "$GRADBRIDGE_CLASSPATH", overridden.stdout + overridden.stderr
