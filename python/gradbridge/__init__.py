"""gradbridge: train PyTorch models from Java and prove the Java run matches the Python one.

Public API:
    export_training_module, export_builtin   -- write a scripted training module (.pt)
    History, EpochRecord                     -- per-epoch training record, JSON Lines I/O
    compare_histories                        -- parity between two histories
    gradbridge.reference                     -- eager torch.optim training (Reference, train)
    gradbridge.java                          -- the Java Trainer and seed driver, in this process
    gradbridge.jvm                           -- the in-process JVM (JPype): start, classpath, errors
"""

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    DivergenceError,
    GradbridgeError,
    InvalidInputError,
    JavaBuildMissingError,
    JavaError,
    ModuleLoadError,
    ProtocolError,
)
from .export import export_builtin, export_training_module  # noqa: E402
from .history import EpochRecord, History  # noqa: E402
from .parity import ParityReport, compare_histories  # noqa: E402

__all__ = [
    "__version__",
    "export_training_module",
    "export_builtin",
    "History",
    "EpochRecord",
    "compare_histories",
    "ParityReport",
    "GradbridgeError",
    "DivergenceError",
    "ModuleLoadError",
    "ProtocolError",
    "InvalidInputError",
    "JavaBuildMissingError",
    "JavaError",
]
