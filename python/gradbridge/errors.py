"""Every exception gradbridge raises, in one module. Messages name the file, method or tensor at fault.

A Java exception crossing JPype becomes the error the Python reference raises for the same input
(``jvm.java_errors``): a label outside the classes is an InvalidInputError naming the data from ``java.train``
and ``reference.train`` alike.
"""

from __future__ import annotations

#: How a program starts its one error line on stderr: Java's (TrainCommand, serve, Spark's programs,
#: the seed driver; the launcher finds their line by it) and, after the program's name, gradbridge's.
ERROR_PREFIX = "error: "
#: How the `gradbridge` command starts every error line on stderr.
CLI_ERROR_PREFIX = f"gradbridge: {ERROR_PREFIX}"


class GradbridgeError(Exception):
    """Base class of every gradbridge error.

    ``java_class`` names the Java exception when the error was raised on the Java side.
    """

    java_class: str | None = None


class ProtocolError(GradbridgeError):
    """A file is not a gradbridge training module, or lacks part of the protocol."""


class InvalidInputError(GradbridgeError):
    """Data does not match what the training module expects (shape, dtype, name)."""


class SetupError(GradbridgeError):
    """The installation cannot run Java: the JDK, torch or the Java library does not fit.

    The message says what to install or set; ``gradbridge doctor`` lists every such problem.
    """


class TorchScriptUnavailableError(SetupError):
    """The installed torch refuses torch.jit.script or torch.jit.load, which gradbridge's training
    modules need (one line naming the call and torch's reason)."""


class JavaBuildMissingError(SetupError):
    """The Java library's jars are missing (not built, not bundled, or a classpath names missing files)."""


class JavaError(GradbridgeError):
    """An unexpected error raised by the Java side, carried over JPype; the JVM stays usable."""


class ModuleLoadError(GradbridgeError):
    """A training module file is missing or cannot be loaded by libtorch."""


class DivergenceError(GradbridgeError):
    """A training loss became NaN or infinite; the message names the epoch and batch."""


class TrainingError(GradbridgeError):
    """A training step (or another scripted method) failed inside PyTorch; the message names the module and
    torch's own reason (and the epoch, from ``reference.train``). Java's ``MethodCallException`` arrives as this
    error. (A label or id the model cannot take is an InvalidInputError naming the data and the array.)"""


class ExportError(GradbridgeError):
    """The model cannot be turned into a training module (e.g. it cannot be scripted)."""


class CaptureError(ExportError):
    """TorchScript cannot capture the model faithfully: it neither scripts nor traces, or the export's check
    found the captured module differs from the eager model (``format="auto"`` then tries protocol 3)."""


class GroupError(GradbridgeError, ValueError):
    """A parameter group or frozen parameter that does not fit the model."""


class FineTuneError(GradbridgeError, ValueError):
    """A fine-tuning option that does not fit the model (one line naming it)."""


class DTypeError(GradbridgeError, ValueError):
    """A tensor of a dtype gradbridge does not take there (a parameter of complex dtype, an input of
    bfloat16 in a data file): one line naming it, its dtype and the dtypes it may have."""


class LogError(GradbridgeError):
    """A feedback log that cannot be replayed: missing, damaged, or not for this model."""


class WriteError(GradbridgeError, OSError):
    """A file gradbridge was asked to write cannot be written: one line naming the user's path
    (never the temp file's)."""


class OpListError(GradbridgeError, ValueError):
    """A protocol-3 op list (``gradbridge._runtime.oplist``) this gradbridge cannot write or run: one line naming what."""
