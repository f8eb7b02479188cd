"""The in-process JVM: Java's gradbridge library called from Python through JPype.

One JVM per process, started on the classpath that ``gradbridge._runtime.classpath`` resolves (the
checkout's Gradle build, the jars inside an installed wheel, or ``GRADBRIDGE_CLASSPATH``; then
the user's own jars and class folders), with gradbridge's native library (built for the torch that
``import torch`` loaded, see ``gradbridge._runtime.native``) on that same libtorch: one libtorch per process,
so both languages share one allocator, one thread pool and one random generator.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

from ._runtime import classpath, jdk, native, torch_gate
from . import errors, messages

#: Extra JVM options (whitespace-separated), e.g. "-Xmx4g". Tried first in a JVM of its own
#: (``check_options``): a JVM that rejects one, or dies of one, would end this process with its own lines.
JVM_OPTIONS_ENV = "GRADBRIDGE_JVM_OPTIONS"
#: Inside Python, Java logs warnings only (the CLIs log progress at info); an option in
#: GRADBRIDGE_JVM_OPTIONS comes later and wins.
_QUIET_LOGGING = "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"

#: Java exception -> the error the Python reference raises for the same input (JavaError for the rest).
_PY_ERRORS = {
    "dev.gradbridge.ModuleLoadException": errors.ModuleLoadError,
    "dev.gradbridge.ProtocolException": errors.ProtocolError,
    "dev.gradbridge.InvalidInputException": errors.InvalidInputError,
    "dev.gradbridge.DivergenceException": errors.DivergenceError,
    "dev.gradbridge.MethodCallException": errors.TrainingError,
}


def start(extra_options: Sequence[str] = (), extra_classpath: Sequence[str | os.PathLike] = (), *,
          classpath_source: str = "jvm.start(extra_classpath=...)") -> None:
    """Start the JVM once for this process; later calls only add ``extra_classpath``.

    The classpath is gradbridge's own jars (``gradbridge._runtime.classpath.resolve``), then the user's:
    entries given to ``jpype.addClassPath`` before this call, ``GRADBRIDGE_USER_CLASSPATH``, then
    ``extra_classpath`` (jars, class folders, ``dir/*``). Raises JavaBuildMissingError when the
    Java library is missing, SetupError when the JDK or torch does not fit it or a user entry does
    not exist, GradbridgeError when the JVM cannot start.
    """
    import jpype

    if jpype.isJVMStarted():
        for entry in classpath.check_entries(extra_classpath, classpath_source):
            jpype.addClassPath(entry)  # JPype's class loader takes paths after start too
        return
    path = classpath.resolve()
    user = classpath.user_entries(extra_classpath, classpath_source)
    torch_gate.require_torch()
    options = native.jvm_options()  # builds the native library for this torch once, when needed
    libjvm = jdk.libjvm_path()
    version = jdk.libjvm_version(libjvm)
    if version is not None:
        jdk.require(version, libjvm)
    user_options = os.environ.get(JVM_OPTIONS_ENV, "").split()
    extra = [*user_options, *extra_options]
    check_options(extra, libjvm, f"{JVM_OPTIONS_ENV}={' '.join(user_options)}" if user_options else None)
    try:
        jpype.startJVM(*options, _QUIET_LOGGING, *extra, jvmpath=libjvm,
                       classpath=[*path.entries, *user], convertStrings=False)
    except Exception as ex:  # JPype raises OSError, RuntimeError or its own JVMNotFoundException
        raise errors.GradbridgeError(f"cannot start the JVM ({libjvm}, extra options: {extra or 'none'}): {ex}") from ex
    jdk.require(str(jpype.JClass("java.lang.System").getProperty("java.version")), libjvm)
    jpype.JClass("dev.gradbridge.cli.ConsoleLogging").applyDefaults()


#: Starts a JVM in a process of its own with the options given as arguments (libjvm first), as
#: jpype.startJVM does here; the JVM's own lines go to stderr.
_OPTIONS_PROBE = ("import sys, jpype\ntry:\n    jpype.startJVM(*sys.argv[2:], jvmpath=sys.argv[1])\n"
                  "except Exception:\n    sys.exit(1)\n")


def check_options(options: Sequence[str], libjvm: str, env: str | None) -> None:
    """Start a JVM with the extra ``options`` in a process of its own first: one the JVM refuses
    (``-Xbogus``) or dies of (``-Xmx1k``) would otherwise end this process, or print the JVM's own
    lines before gradbridge's. SetupError naming ``env`` (``GRADBRIDGE_JVM_OPTIONS=...``, when the
    options came from it) and the JVM's own reason."""
    import subprocess
    import sys

    if not options:
        return
    try:
        result = subprocess.run([sys.executable, "-c", _OPTIONS_PROBE, libjvm, *options], capture_output=True,
                                text=True, timeout=300, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        reason = "the JVM did not start within 300 s"
    else:
        if result.returncode == 0:
            return
        lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        reason = "; ".join(lines[:2]) or f"exit code {result.returncode}"
    raise errors.SetupError(messages.jvm_options_refused(env or f"extra_options={list(options)}", reason))


def jclass(name: str):
    """A Java class by name, starting the JVM if needed; JavaBuildMissingError when the classpath lacks it."""
    import jpype

    start()
    try:
        return jpype.JClass(name)
    except TypeError as ex:  # JPype: "Class ... is not found"
        raise errors.JavaBuildMissingError(
            f"the Java classpath ({classpath.resolve().source}) lacks {name}: rebuild the Java library "
            f"(`gradle assemble` in a checkout, `make dist` for a wheel)") from ex


@contextmanager
def java_errors() -> Iterator[None]:
    """Turn a Java exception into the matching gradbridge error; the JVM stays usable."""
    import jpype

    try:
        yield
    except jpype.JException as ex:
        java_class = str(ex.getClass().getName())
        error = _PY_ERRORS.get(java_class, errors.JavaError)(f"{ex.getMessage()} [{java_class}]")
        error.java_class = java_class
        raise error from ex


#: numpy dtypes that cross to Java -> (torch's dtype name, JPype's primitive type)
_DTYPES = {np.dtype(np.float32): ("float32", "JFloat"), np.dtype(np.float64): ("float64", "JDouble"),
           np.dtype(np.int64): ("int64", "JLong")}


def dtype_name(values: np.ndarray, what: str = "array") -> str:
    """torch's name for the array's dtype; InvalidInputError for a dtype Java does not take."""
    if values.dtype not in _DTYPES:
        raise errors.InvalidInputError(f"{what} has dtype {values.dtype}; expected float32, float64 or int64")
    return _DTYPES[values.dtype][0]


def java_shape(values: np.ndarray):
    """The array's shape as a Java ``long[]``."""
    import jpype

    return jpype.JArray(jpype.JLong)([int(d) for d in values.shape])


def direct_buffer(values: np.ndarray, what: str = "array"):
    """A direct ``java.nio.ByteBuffer`` over the (C-contiguous) array's own memory, no copy: keep the
    array alive while Java uses it. InvalidInputError naming ``what`` for a dtype Java does not take."""
    import jpype.nio

    dtype_name(values, what)
    return jpype.nio.convertToDirectBuffer(memoryview(values).cast("B"))


def to_tensor(values: np.ndarray):
    """A Java ``dev.gradbridge.Tensor`` holding a copy of ``values`` (float32, float64 or int64), same shape.

    The caller owns it: close it (or let it go with the module's run; the JVM frees it eventually)."""
    import jpype

    values = np.asarray(values)
    dtype_name(values)
    java_type = getattr(jpype, _DTYPES[values.dtype][1])
    Tensor = jclass("dev.gradbridge.Tensor")
    flat = jpype.JArray(java_type)(np.ascontiguousarray(values).ravel())
    with java_errors():
        return Tensor.of(flat, java_shape(values))


def load_module(path: str | os.PathLike, op_libraries: Sequence[str | os.PathLike] = (), device: str = "cpu"):
    """Load an exported module with the Java library; returns the Java TrainingModule (close it).

    ``op_libraries``: custom-operator libraries Java loads first (``TrainingModule.load(path, libraries)``).
    ``device``: where it trains (``cpu``, ``cuda:N``; ``TrainingModule.load(path, libraries, device)``).
    """
    TrainingModule = jclass("dev.gradbridge.TrainingModule")
    Paths = jclass("java.nio.file.Paths")
    libraries = jclass("java.util.ArrayList")()
    for library in op_libraries:
        libraries.add(Paths.get(str(library)))
    with java_errors():
        if device == "cpu":
            return TrainingModule.load(Paths.get(str(path)), libraries)
        return TrainingModule.load(Paths.get(str(path)), libraries, device)
