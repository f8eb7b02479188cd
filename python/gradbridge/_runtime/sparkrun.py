"""gradbridge-spark in a JVM of its own: ``java`` on the Spark subproject's classpath.

``gradle assemble`` writes ``spark/build/gradbridge-spark-classpath.txt`` (gradbridge-spark,
gradbridge, the pytorch-native-cpu jar and Spark's jars) and ``spark/build/gradbridge-spark-jvm-args.txt`` (the
``--add-opens`` flags Spark needs on Java 17). Spark never runs inside the JPype JVM of a Python
process: it starts here, in a separate ``java`` process pointed at this Python's libtorch, so the
Java run and the eager replay (``reference.train_sharded``) run the same kernels.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import List, Sequence

from . import devtree as _devtree, classpath, native
from ..errors import GradbridgeError, JavaBuildMissingError
from .launcher import error_line, java_command

SPARK_MAIN = "dev.gradbridge.spark.SparkTrainCommand"
PARQUET_MAIN = "dev.gradbridge.spark.NpzToParquet"
CLASSPATH_FILE = "spark/build/gradbridge-spark-classpath.txt"
JVM_ARGS_FILE = "spark/build/gradbridge-spark-jvm-args.txt"


def _build_file(name: str) -> Path:
    root = _devtree.require_root("gradbridge-spark")
    path = root / name
    if not path.is_file():
        raise JavaBuildMissingError(f"{path} is missing: run `gradle assemble` in {root}")
    return path


def command(args: Sequence[object] = (), *, jvm_options: Sequence[str] = (), main: str = SPARK_MAIN) -> List[str]:
    """The command line that runs ``main`` (``SparkTrainCommand``) with ``args`` in a new JVM.

    Its own classpath file, not ``classpath.resolve()``'s: Spark brings its own slf4j binding, and the
    checks and wording are ``classpath.read_listing``'s."""
    entries = classpath.read_listing(_devtree.require_root("gradbridge-spark") / CLASSPATH_FILE, "gradbridge-spark")
    jvm_args = [line for line in _build_file(JVM_ARGS_FILE).read_text().splitlines() if line.strip()]
    # gradbridge-spark's own Gloo library, built for this Python's torch like the core library
    gloo = f"-Dgradbridge.gloo.library={native.ensure_gloo()}"
    return java_command(main, args, entries=entries, jvm_options=[*jvm_args, gloo, *jvm_options])


def run(args: Sequence[object], *, check: bool = True, timeout: float = 600,
        jvm_options: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run the Spark trainer; with ``check``, GradbridgeError carrying its error line when it fails."""
    result = subprocess.run(command(args, jvm_options=jvm_options), capture_output=True, text=True,
                            check=False, timeout=timeout)
    if check and result.returncode != 0:
        raise GradbridgeError(f"SparkTrainCommand failed: {error_line(result.stderr, result.returncode)}")
    return result


def to_parquet(pairs: Sequence[tuple], *, timeout: float = 300) -> None:
    """Write each ``(npz, parquet_folder)`` as Parquet (columns x, y; ``NpzToParquet``), one JVM for all."""
    args = [str(part) for pair in pairs for part in pair]
    result = subprocess.run(command(args, main=PARQUET_MAIN), capture_output=True, text=True, check=False,
                            timeout=timeout)
    if result.returncode != 0:
        raise GradbridgeError(f"NpzToParquet failed: {error_line(result.stderr, result.returncode)}")
