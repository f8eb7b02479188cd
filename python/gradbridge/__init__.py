"""gradbridge: train PyTorch models from Java and prove the Java run matches the Python one.

Public API:
    export_training_module, export_builtin   -- write a scripted training module (.pt)
    History, EpochRecord                     -- per-epoch training record, JSON Lines I/O
    compare_histories, ParityReport          -- parity between two histories
    load_for_python                          -- an exported module, loaded to train from Python
    gradbridge.reference                     -- eager torch.optim training (Reference, train)
    gradbridge.java                          -- the Java Trainer and seed driver, in this process
    gradbridge.jvm                           -- the in-process JVM (JPype): start, errors
    GradbridgeError and its subclasses       -- every error gradbridge raises (gradbridge.errors)

``import gradbridge`` is light: torch, numpy and JPype load only when something needs them (the
pytest plugin costs nothing in a test run that does not use its fixtures).
"""

from .errors import (
    CaptureError,
    DivergenceError,
    DTypeError,
    ExportError,
    FineTuneError,
    GradbridgeError,
    GroupError,
    InvalidInputError,
    JavaBuildMissingError,
    JavaError,
    LogError,
    ModuleLoadError,
    OpListError,
    ProtocolError,
    SetupError,
    TorchScriptUnavailableError,
    TrainingError,
    WriteError,
)

from ._version import __version__

from ._runtime import lazy as _lazy

# name -> submodule that defines it, imported on first use (PEP 562).
_LAZY = {
    "export_training_module": "export",
    "export_builtin": "export",
    "History": "history",
    "EpochRecord": "history",
    "compare_histories": "parity",
    "ParityReport": "parity",
    "load_for_python": "_runtime.torchscript",
}


__getattr__ = _lazy.attributes(__name__, _LAZY)


__all__ = [
    "__version__",
    *_LAZY,
    "GradbridgeError",
    "CaptureError",
    "DivergenceError",
    "DTypeError",
    "ExportError",
    "FineTuneError",
    "GroupError",
    "InvalidInputError",
    "JavaBuildMissingError",
    "JavaError",
    "LogError",
    "ModuleLoadError",
    "OpListError",
    "ProtocolError",
    "SetupError",
    "TorchScriptUnavailableError",
    "TrainingError",
    "WriteError",
]
