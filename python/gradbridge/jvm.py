"""The in-process JVM: Java's gradbridge library called from Python through JPype.

One JVM per process, started with the classpath that the Gradle build wrote
(``build/gradbridge-classpath.txt``), and with DJL pointed at the libtorch that ``import torch``
already loaded: one libtorch per process, so both languages share one allocator, one thread
pool and one random generator.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Sequence

import numpy as np

from . import errors

REPO_ROOT = Path(__file__).resolve().parents[2]
CLASSPATH_FILE = REPO_ROOT / "build" / "gradbridge-classpath.txt"
BUILD_COMMAND = "gradle assemble"
#: Overrides the classpath file: entries separated by os.pathsep.
CLASSPATH_ENV = "GRADBRIDGE_CLASSPATH"
#: Extra JVM options (whitespace-separated), e.g. "-Xmx4g". A JVM that rejects one exits the process.
JVM_OPTIONS_ENV = "GRADBRIDGE_JVM_OPTIONS"
#: The libjvm.so to load instead of the one JPype finds (JAVA_HOME, then the system's).
JVM_PATH_ENV = "GRADBRIDGE_JVM"

_PY_ERRORS = {
    "dev.gradbridge.ModuleLoadException": errors.ModuleLoadError,
    "dev.gradbridge.ProtocolException": errors.ProtocolError,
    "dev.gradbridge.InvalidInputException": errors.InvalidInputError,
    "dev.gradbridge.DivergenceException": errors.DivergenceError,
}


def classpath() -> List[str]:
    """The Java library's runtime classpath, as the Gradle build wrote it."""
    text = os.environ.get(CLASSPATH_ENV)
    if not text:
        if not CLASSPATH_FILE.is_file():
            raise errors.JavaBuildMissingError(
                f"the Java library is not built: {CLASSPATH_FILE} is missing. "
                f"Build it with `{BUILD_COMMAND}` in {REPO_ROOT} (or run the README's set-up)."
            )
        text = CLASSPATH_FILE.read_text(encoding="utf-8")
    entries = [e for e in text.strip().split(os.pathsep) if e]
    missing = [e for e in entries if not Path(e).exists()]
    if missing:
        raise errors.JavaBuildMissingError(
            f"the Java classpath names files that do not exist: {missing[:3]}. "
            f"Rebuild with `{BUILD_COMMAND}` in {REPO_ROOT}."
        )
    return entries


def jvm_options() -> List[str]:
    """System properties that make DJL use this process's libtorch and never download."""
    import torch  # libtorch must be loaded by Python first; DJL then reuses it.

    return [
        "-Dai.djl.offline=true",
        f"-DPYTORCH_LIBRARY_PATH={Path(torch.__file__).parent / 'lib'}",
        f"-DPYTORCH_VERSION={torch.__version__.split('+')[0]}",
        "-DPYTORCH_FLAVOR=cpu",
    ]


def start(extra_options: Sequence[str] = ()) -> None:
    """Start the JVM once for this process; later calls return at once.

    Raises JavaBuildMissingError when the Java build is missing, GradbridgeError when the JVM
    cannot start.
    """
    import jpype

    if jpype.isJVMStarted():
        return
    entries = classpath()
    extra = [*os.environ.get(JVM_OPTIONS_ENV, "").split(), *extra_options]
    jvm_path = os.environ.get(JVM_PATH_ENV) or None
    try:
        jpype.startJVM(*jvm_options(), *extra, jvmpath=jvm_path, classpath=entries, convertStrings=False)
    except Exception as ex:  # JPype raises OSError, RuntimeError or its own JVMNotFoundException
        raise errors.GradbridgeError(
            f"cannot start the JVM ({jvm_path or 'found by JPype'}, extra options: {extra or 'none'}): {ex}") from ex


def jclass(name: str):
    """A Java class by name, starting the JVM if needed."""
    import jpype

    start()
    return jpype.JClass(name)


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


def to_java_floats(values: np.ndarray):
    """A Java float[] holding ``values`` (one bulk copy through the buffer protocol)."""
    import jpype

    return jpype.JArray(jpype.JFloat)(np.ascontiguousarray(values, dtype=np.float32).ravel())


#: numpy dtypes that cross to Java -> (torch's dtype name, JPype's primitive type)
_DTYPES = {np.dtype(np.float32): ("float32", "JFloat"), np.dtype(np.float64): ("float64", "JDouble"),
           np.dtype(np.int64): ("int64", "JLong")}


def dtype_name(values: np.ndarray, what: str = "array") -> str:
    """torch's name for the array's dtype; InvalidInputError for a dtype Java does not take."""
    if values.dtype not in _DTYPES:
        raise errors.InvalidInputError(f"{what} has dtype {values.dtype}; expected float32, float64 or int64")
    return _DTYPES[values.dtype][0]


def to_ndarray(manager, values: np.ndarray):
    """A DJL NDArray on ``manager`` holding ``values`` (float32, float64 or int64), same shape."""
    import jpype

    values = np.asarray(values)
    dtype_name(values)
    java_type = getattr(jpype, _DTYPES[values.dtype][1])
    Shape = jclass("ai.djl.ndarray.types.Shape")
    flat = jpype.JArray(java_type)(np.ascontiguousarray(values).ravel())
    with java_errors():
        return manager.create(flat, Shape(*[int(d) for d in values.shape]))


def load_module(path: str | os.PathLike):
    """Load an exported module with the Java library; returns the Java TrainingModule (close it)."""
    TrainingModule = jclass("dev.gradbridge.TrainingModule")
    Paths = jclass("java.nio.file.Paths")
    with java_errors():
        return TrainingModule.load(Paths.get(str(path)))
