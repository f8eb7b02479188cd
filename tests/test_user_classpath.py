"""The user's own Java code in the in-process JVM, beside gradbridge's library.

A real user class is compiled here (javac, against gradbridge's jar: it calls gradbridge's
``Protocol``), as a class folder and as a jar, and called from Python in a fresh process for
each way of adding it: ``jvm.start(extra_classpath=...)``, ``GRADBRIDGE_USER_CLASSPATH``,
``jpype.addClassPath`` before ``jvm.start()``, after it, and the pytest plugin's ini option.
A missing entry is one line naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gradbridge._runtime import classpath, jdk
from tests.user_code import CALL, EXPECTED, USER_CLASS


@pytest.fixture(scope="module")
def user_code(tmp_path_factory):
    """(class folder, jar) holding my.project.Thing, compiled against gradbridge's jar."""
    base = tmp_path_factory.mktemp("user-code")
    source = base / "src" / "my" / "project" / "Thing.java"
    source.parent.mkdir(parents=True)
    source.write_text(USER_CLASS)
    classes = base / "classes"
    javac = Path(jdk.java_executable()).with_name("javac")
    library = classpath.resolve().library_jar()
    result = subprocess.run([javac, "-d", classes, "-cp", library, source], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    jar = base / "thing.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        archive.write(classes / "my" / "project" / "Thing.class", "my/project/Thing.class")
    return classes, jar


def _python(code: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != classpath.USER_CLASSPATH_ENV}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=300)


def _protocol_methods() -> int:
    from gradbridge import protocol

    return len(protocol.REQUIRED_METHODS)


@pytest.mark.parametrize("way", ["start-argument-folder", "start-argument-jar", "environment", "jpype-before",
                                 "jpype-after"])
def test_user_class_is_called_from_python(user_code, tmp_path, way):
    folder, jar = user_code
    env = None
    if way == "start-argument-folder":
        code = f"from gradbridge import jvm; jvm.start(extra_classpath=[{str(folder)!r}]); {CALL}"
    elif way == "start-argument-jar":  # one path, not in a list
        code = f"from gradbridge import jvm; jvm.start(extra_classpath={str(jar)!r}); {CALL}"
    elif way == "environment":
        env = {classpath.USER_CLASSPATH_ENV: f"{tmp_path}{os.pathsep}{jar}"}
        code = f"from gradbridge import jvm; jvm.start(); {CALL}"
    elif way == "jpype-before":
        code = f"import jpype; jpype.addClassPath({str(folder)!r}); from gradbridge import jvm; jvm.start(); {CALL}"
    else:
        code = (f"from gradbridge import jvm; jvm.start(); jvm.start(extra_classpath=[{str(jar)!r}]); {CALL}")
    result = _python(code, tmp_path, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"{EXPECTED}{_protocol_methods()}"


def test_user_class_in_a_pytest_project_through_the_ini_option(user_code, pytester):
    folder, jar = user_code
    pytester.makeini(f"[pytest]\naddopts = -p no:faulthandler\ngradbridge_classpath =\n    {folder}\n    lib/thing.jar\n")
    (pytester.path / "lib").mkdir()
    (pytester.path / "lib" / "thing.jar").write_bytes(jar.read_bytes())
    pytester.makepyfile(test_mine=f"""
        import jpype

        def test_my_class(gradbridge_jvm):
            assert str(jpype.JClass("my.project.Thing").describe("pytest")) == "hello pytest, protocol methods: {_protocol_methods()}"
        """)
    result = pytester.runpytest_subprocess("-q")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("way", ["start-argument", "environment", "jpype-before", "ini-option"])
def test_missing_user_entry_is_one_line(tmp_path, pytester, way):
    missing = tmp_path / "gone.jar"
    if way == "ini-option":
        pytester.makeini(f"[pytest]\naddopts = -p no:faulthandler\ngradbridge_classpath = {missing}\n")
        pytester.makepyfile(test_mine="def test_my_class(gradbridge_jvm):\n    pass\n")
        result = pytester.runpytest_subprocess("-q")
        result.assert_outcomes(errors=1)
        assert (f"gradbridge: the classpath entry {missing} (from the pytest ini option gradbridge_classpath) "
                "does not exist: build it, or correct the entry") in result.outlines, result.outlines
        assert not [line for line in result.outlines if "Traceback" in line or "During handling" in line]
        return
    env = None
    code = "from gradbridge import jvm; jvm.start()"
    source = {"start-argument": "jvm.start(extra_classpath=...)", "environment": f"${classpath.USER_CLASSPATH_ENV}",
              "jpype-before": "jpype.addClassPath"}[way]
    if way == "start-argument":
        code = f"from gradbridge import jvm; jvm.start(extra_classpath=[{str(missing)!r}])"
    elif way == "environment":
        env = {classpath.USER_CLASSPATH_ENV: str(missing)}
    else:
        code = f"import jpype; jpype.addClassPath({str(missing)!r}); {code}"
    code = ("import sys\nfrom gradbridge.errors import SetupError\ntry:\n    " + code.replace("; ", "\n    ") +
            "\nexcept SetupError as ex:\n    print(ex, file=sys.stderr); sys.exit(1)\n"
            "import jpype\nassert not jpype.isJVMStarted()\n")
    result = _python(code, tmp_path, env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stdout + result.stderr
    assert lines[0] == (f"the classpath entry {missing} (from {source}) does not exist: build it, "
                        "or correct the entry")
