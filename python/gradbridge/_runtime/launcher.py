"""Java programs in a JVM of their own: the Trainer's CLI (``train``) and the seed driver.

The command is ``java`` (checked to be 17+) on the classpath that ``gradbridge._runtime.classpath``
resolves, on the libtorch that ``gradbridge._runtime.native`` points it at. No Gradle,
no checkout: this is what an installed wheel runs.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, List, Sequence

from . import classpath, devices, jdk, native, torch_gate
from .. import messages, protocol
from ..errors import ERROR_PREFIX, GradbridgeError

if TYPE_CHECKING:  # numpy only when a history is read
    from ..history import History

TRAIN_MAIN = "dev.gradbridge.cli.TrainCommand"
SEED_MAIN = "dev.gradbridge.examples.LinearRegressionTraining"


def java_command(main_class: str, args: Sequence[object] = (), *, entries: Sequence[str],
                 jvm_options: Sequence[str] = (), use_torch_lib: bool = True) -> List[str]:
    """The one ``java ... -cp ... main_class args`` command line every JVM of its own runs (the Trainer's
    CLI, serve, the Kafka reader, Spark, the bench's workers). The torch gate comes first, always
    (a torch outside the range or unverified starts no JVM), then ``java`` checked to be 17+, this
    Python's libtorch and the native library built for it (unless ``use_torch_lib`` is false: the
    classpath brings its own libtorch), ``jvm_options``, the classpath ``entries``."""
    torch_gate.require_torch()
    return [jdk.checked_java(), *(native.jvm_options() if use_torch_lib else []), *jvm_options,
            "-cp", os.pathsep.join(entries), main_class, *map(str, args)]


#: The JVM option that loads libtorch's CUDA libraries with libtorch (Java: NativeLibrary.CUDA_PROPERTY).
CUDA_OPTION = "-Dgradbridge.cuda=true"


def command(main_class: str, args: Sequence[object] = (), *, extra_classpath: Sequence[str] = (),
            cuda: bool = False) -> List[str]:
    """The full command line that runs ``main_class`` with ``args`` in a new JVM, on gradbridge's
    classpath followed by ``extra_classpath``. ``cuda``: for a run on a CUDA device, on this Python's
    libtorch (the pytorch-native jar's is a CPU build) with its CUDA libraries loaded at start."""
    core = classpath.resolve()
    path = classpath.Classpath([*core.entries, *extra_classpath], core.source)
    return java_command(main_class, args, entries=path.entries, use_torch_lib=cuda or not path.has_native_libtorch,
                        jvm_options=[CUDA_OPTION] if cuda else [])


def cuda_environment() -> dict:
    """This process's environment with cuBLAS's reproducible workspace (unless set), for a JVM on CUDA: it
    must be set before CUDA starts there."""
    return {messages.CUBLAS_WORKSPACE_CONFIG: messages.CUBLAS_WORKSPACE_VALUE, **os.environ}


def error_line(stderr: str, returncode: int) -> str:
    """The program's own error line; else the last line it printed; else the exit code."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line[len(ERROR_PREFIX):] for line in lines if line.startswith(ERROR_PREFIX)]
    if errors:
        return errors[-1]
    return lines[-1] if lines else f"exit code {returncode}"


def run(main_class: str, args: Sequence[object] = (), *, capture: bool = True,
        cuda: bool = False) -> subprocess.CompletedProcess:
    """Run ``main_class``; GradbridgeError with the program's error line when it fails.

    With ``capture=False`` the program's output goes to this process's terminal. ``cuda``: see ``command``.
    """
    result = subprocess.run(command(main_class, args, cuda=cuda), capture_output=capture, text=True, check=False,
                            env=cuda_environment() if cuda else None)
    if result.returncode != 0:
        detail = error_line(result.stderr, result.returncode) if capture else f"exit code {result.returncode}"
        raise GradbridgeError(f"{main_class.rsplit('.', 1)[-1]} (separate JVM) failed: {detail}")
    return result


def train(model_path: str | os.PathLike, data: str | os.PathLike, *, epochs: int,
          batch_size: int = protocol.DEFAULT_BATCH_SIZE, seed: int = protocol.DEFAULT_SEED,
          mode: str = protocol.DEFAULT_MODE, val: str | os.PathLike | None = None,
          history: str | os.PathLike, op_libraries: Sequence[str | os.PathLike] = (),
          device: str | None = None) -> History:
    """Run the Trainer's CLI (``dev.gradbridge.cli.TrainCommand``) in a JVM of its own and return the
    History it wrote. GradbridgeError carries the program's own error line. ``device``: ``--device``
    (None: the CPU, no option); a CUDA device runs on this Python's libtorch (``command``), checked here first."""
    from ..history import History

    args = ["--model", model_path, "--data", data, "--epochs", epochs, "--batch-size", batch_size, "--seed", seed,
            "--mode", mode, "--history", history] + (["--val", val] if val is not None else [])
    for library in op_libraries:
        args += ["--op-library", library]
    cuda = False
    if device is not None:
        device = devices.require(device)
        cuda = devices.is_cuda(device)
        args += ["--device", device]
    run(TRAIN_MAIN, args, cuda=cuda)
    return History.load(history)
