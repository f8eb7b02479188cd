"""gradbridge's pytest plugin, registered by ``pip install`` (entry point ``pytest11``).

Fixtures:
    gradbridge_jvm   the JVM in this process, started once per session (module gradbridge.jvm)
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


@pytest.fixture(scope="session")
def gradbridge_jvm():
    """Starts the JVM in this process once (JPype cannot restart it) and returns gradbridge.jvm."""
    from . import jvm

    jvm.start()
    return jvm


@pytest.fixture(scope="session")
def java_trainer(gradbridge_jvm):
    """``gradbridge.java.train(model_path, x, y, *, epochs, batch_size, seed, mode, val, ...)``."""
    from . import java

    return java.train
