"""gradbridge's pytest plugin, registered by ``pip install`` (entry point ``pytest11``).

Fixtures:
    gradbridge_jvm   the JVM in this process, started once per session (module gradbridge.jvm), with
                     the ini option ``gradbridge_classpath``'s jars and class folders on its classpath
    java_trainer     ``gradbridge.java.train``: the Java Trainer in this process, returns a History
Helper:
    assert_histories_match(python, java, rtol=0, atol=0)  fails naming the first diverging epoch,
                                                          the parameter, both values and the difference

Importing this plugin loads neither torch nor numpy nor JPype: a test run that does not use the
fixtures pays nothing. Run pytest with ``-p no:faulthandler``: the JVM's signal handling looks
like a crash to it.
"""

from __future__ import annotations

import pytest

__all__ = ["assert_histories_match", "gradbridge_jvm", "java_trainer"]


def assert_histories_match(python, java, *, rtol: float = 0.0, atol: float = 0.0,
                           labels: tuple = ("python", "java")):
    """``gradbridge.parity.assert_histories_match``, imported when first called."""
    from .parity import assert_histories_match as check

    return check(python, java, rtol=rtol, atol=atol, labels=labels)


#: ini option (pytest.ini, pyproject.toml's [tool.pytest.ini_options]): the project's own jars and
#: class folders for the JVM, one per line, relative to the ini file.
CLASSPATH_INI = "gradbridge_classpath"


def pytest_addoption(parser):
    parser.addini(CLASSPATH_INI, type="paths", default=[],
                  help="jars and class folders added to the in-process JVM's classpath (after gradbridge's own)")


@pytest.fixture(scope="session")
def gradbridge_jvm(pytestconfig):
    """Starts the JVM in this process once (JPype cannot restart it) and returns gradbridge.jvm.

    The JVM's classpath also holds the entries of the ``gradbridge_classpath`` ini option.
    """
    from . import jvm
    from .errors import GradbridgeError

    problem = None
    try:
        jvm.start(extra_classpath=pytestconfig.getini(CLASSPATH_INI),
                  classpath_source=f"the pytest ini option {CLASSPATH_INI}")
    except GradbridgeError as ex:
        problem = str(ex)
    if problem is not None:  # one line naming the fix, not a traceback through the plugin
        pytest.fail(f"gradbridge: {problem}", pytrace=False)
    return jvm


@pytest.fixture(scope="session")
def java_trainer(gradbridge_jvm):
    """``gradbridge.java.train(model_path, x, y, *, epochs, batch_size, seed, mode, val, ...)``."""
    from . import java

    return java.train
