"""Export an nn.Module as a gradbridge training module (TorchScript + gradbridge.json).

The names below are imported on first use (PEP 562), as in the package above: ``reference`` reads the
losses, optimizers and schedules defined in this package, and the export's check runs ``reference``, so
importing one of these modules must not run the exporter.
"""

from ..errors import ExportError

# name -> module of this package that defines it
_LAZY = {
    "export_training_module": "training_module",
    "export_builtin": "training_module",
    "SUPPORTED_LOSSES": "training_module",
    "SUPPORTED_OPTIMIZERS": "training_module",
    "load_weights": "finetune",
    "state_dict_of": "finetune",
    "save_state_dict": "finetune",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["export_training_module", "export_builtin", "ExportError", "SUPPORTED_LOSSES", "SUPPORTED_OPTIMIZERS",
           "load_weights", "state_dict_of", "save_state_dict"]
