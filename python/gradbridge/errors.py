"""Exceptions raised by gradbridge. Messages name the file, method or tensor at fault."""

from __future__ import annotations

#: How the `gradbridge` command starts every error line on stderr.
CLI_ERROR_PREFIX = "gradbridge: error: "


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


class JavaBuildMissingError(SetupError):
    """The Java library's jars are missing (not built, not bundled, or a classpath names missing files)."""


class JavaError(GradbridgeError):
    """An unexpected error raised by the Java side, carried over JPype; the JVM stays usable."""


class ModuleLoadError(GradbridgeError):
    """A training module file is missing or cannot be loaded by libtorch."""


class DivergenceError(GradbridgeError):
    """A training loss became NaN or infinite; the message names the epoch and batch."""


class TrainingError(GradbridgeError):
    """A training step failed inside PyTorch (e.g. a class label outside the model's classes);
    the message names the module, the epoch and torch's own reason."""
