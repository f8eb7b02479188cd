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
from gradbridge._devtree import root
from gradbridge.parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL, assert_histories_match

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


@pytest.fixture(scope="session")
def user_env(wheel, tmp_path_factory):
    """A fresh venv with the wheel installed by pip; returns (bin folder, environment for commands)."""
    base = tmp_path_factory.mktemp("user-env")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    deps = base / "third-party"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not _NOT_LINKED.search(entry.name):
            (deps / entry.name).symlink_to(entry)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "third_party.pth").write_text(f"{deps}\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GRADBRIDGE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    result = _run([venv / "bin" / "python", "-m", "pip", "install", "--no-input", wheel], cwd=base, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return venv / "bin", env


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
    assert not [n for n in names if "pytorch-native" in n], "the wheel must not carry DJL's native libtorch"
    assert any(n.startswith("gradbridge/jars/pytorch-jni-") for n in names)
    assert f"\nVersion: {VERSION}\n" in metadata
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


@pytest.mark.parametrize("case", ["no_jars", "missing_jar", "old_java", "other_torch"])
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
    else:                       # torch's version seen as another release
        command = [bin_dir / "python", "-c", "import sys, torch; torch.__version__ = '2.6.0+cpu'; "
                   "from gradbridge.commands.main import main; sys.exit(main(sys.argv[1:]))", *command[1:]]
        expected = r"torch 2\.6\.0 is installed, but this gradbridge's Java library \(DJL\) runs libtorch 2\.7\.1: " \
                   r"pip install torch==2\.7\.1"
    result = _run(command, cwd=outside, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stdout + result.stderr
    assert lines[0].startswith("gradbridge: error: ") and re.search(expected, lines[0]), lines[0]
    if case != "other_torch":
        doctor = _run([bin_dir / "gradbridge", "doctor"], cwd=outside, env=env)
        problems = [line for line in doctor.stdout.splitlines() if line.startswith("problem: ")]
        assert doctor.returncode == 1 and len(problems) == 1 and re.search(expected, problems[0]), doctor.stdout


# ---- the Maven artifact and a Gradle application that uses it ----

@pytest.fixture(scope="session")
def published():
    result = _run(["gradle", "--no-daemon", "-q", "publishToMavenLocal"], cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return M2


def test_published_pom_declares_djl_as_api_and_libtorch_at_run_time(published):
    pom = ElementTree.parse(published / f"gradbridge-{VERSION}.pom").getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    assert pom.findtext("m:version", namespaces=ns) == VERSION
    deps = {(d.findtext("m:artifactId", namespaces=ns), d.findtext("m:classifier", namespaces=ns)):
            d.findtext("m:scope", namespaces=ns) for d in pom.iterfind("m:dependencies/m:dependency", ns)}
    assert deps[("api", None)] == "compile" and deps[("pytorch-engine", None)] == "compile"
    assert deps[("pytorch-jni", None)] == "runtime"
    assert deps[("pytorch-native-cpu", "linux-x86_64")] == "runtime"
    assert not [artifact for artifact, _ in deps if artifact.startswith("slf4j-simple")]
    for suffix in ("sources", "javadoc"):
        with zipfile.ZipFile(published / f"gradbridge-{VERSION}-{suffix}.jar") as jar:
            assert any(n.endswith("TrainingModule." + ("java" if suffix == "sources" else "html")) for n in jar.namelist())


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


def test_readme_names_the_project_version():
    text = (REPO_ROOT / "README.md").read_text()
    assert set(re.findall(r"gradbridge-(\d+\.\d+\.\d+)-py3", text)) == {VERSION}
    assert set(re.findall(r"dev\.gradbridge:gradbridge:(\d+\.\d+\.\d+)", text)) == {VERSION}


def test_separate_jvm_runs_offline_on_the_wheels_jars_and_the_override_wins(user_env, outside):
    bin_dir, env = user_env
    probe = ("from gradbridge import classpath, launcher\n"
             "print(classpath.resolve().source)\n"
             "print(' '.join(launcher.command(launcher.TRAIN_MAIN, ['--help'])))\n")
    result = _run([bin_dir / "python", "-c", probe], cwd=outside, env=env)
    assert result.returncode == 0, result.stderr
    source, command = result.stdout.splitlines()
    assert source.startswith("the jars of the installed package")
    assert "-Dai.djl.offline=true" in command and "-DPYTORCH_LIBRARY_PATH=" in command
    assert "pytorch-native" not in command
    jars = command.split(" -cp ")[1].split()[0]
    assert all(Path(jar).parent.parent.parent.name == "site-packages" and Path(bin_dir.parent) in Path(jar).parents
               for jar in jars.split(os.pathsep)), jars
    overridden = _run([bin_dir / "python", "-c", probe], cwd=outside, env={**env, "GRADBRIDGE_CLASSPATH": jars})
    assert overridden.stdout.splitlines()[0] == "$GRADBRIDGE_CLASSPATH", overridden.stdout + overridden.stderr
