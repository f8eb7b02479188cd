"""Java programs in a JVM of their own: the Trainer's CLI and the seed driver.

The command is ``java`` (checked to be 17+) on the classpath that ``gradbridge.classpath``
resolves, with DJL offline and on the libtorch that ``gradbridge.libtorch`` chooses. No Gradle,
no checkout: this is what an installed wheel runs.
"""

from __future__ import annotations

import os
import subprocess
from typing import List, Sequence

from . import classpath, jdk, libtorch
from .errors import GradbridgeError

TRAIN_MAIN = "dev.gradbridge.cli.TrainCommand"
SEED_MAIN = "dev.gradbridge.examples.LinearRegressionTraining"
#: Java programs report a bad input as one line starting with this (TrainCommand, the seed driver).
ERROR_PREFIX = "error: "


def command(main_class: str, args: Sequence[object] = ()) -> List[str]:
    """The full command line that runs ``main_class`` with ``args`` in a new JVM."""
    path = classpath.resolve()
    libtorch.require(path.versions()["torch"])
    return [jdk.checked_java(), *libtorch.djl_options(use_torch_lib=not path.has_native_libtorch),
            "-cp", os.pathsep.join(path.entries), main_class, *map(str, args)]


def error_line(stderr: str, returncode: int) -> str:
    """The program's own error line; else the last line it printed; else the exit code."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line[len(ERROR_PREFIX):] for line in lines if line.startswith(ERROR_PREFIX)]
    if errors:
        return errors[-1]
    return lines[-1] if lines else f"exit code {returncode}"


def run(main_class: str, args: Sequence[object] = (), *, capture: bool = True) -> subprocess.CompletedProcess:
    """Run ``main_class``; GradbridgeError with the program's error line when it fails.

    With ``capture=False`` the program's output goes to this process's terminal.
    """
    result = subprocess.run(command(main_class, args), capture_output=capture, text=True, check=False)
    if result.returncode != 0:
        detail = error_line(result.stderr, result.returncode) if capture else f"exit code {result.returncode}"
        raise GradbridgeError(f"{main_class.rsplit('.', 1)[-1]} (separate JVM) failed: {detail}")
    return result
