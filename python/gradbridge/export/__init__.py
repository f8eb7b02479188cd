"""Export an nn.Module as a gradbridge training module (TorchScript + gradbridge.json).

The names below are imported on first use (PEP 562), as in the package above: ``reference`` reads the
losses, optimizers and schedules defined in this package, and the export's check runs ``reference``, so
importing one of these modules must not run the exporter.
"""

from .._runtime import lazy as _lazy
from ..errors import ExportError

# name -> module of this package that defines it
_LAZY = {
    "export_training_module": "training_module",
    "export_builtin": "training_module",
    "SUPPORTED_LOSSES": "training_module",
    "SUPPORTED_OPTIMIZERS": "training_module",
    "load_weights": "finetune",
    "state_dict_of": "weights",
    "save_state_dict": "weights",
    "save_adapter": "weights",
}


__getattr__ = _lazy.attributes(__name__, _LAZY)


__all__ = ["export_training_module", "export_builtin", "ExportError", "SUPPORTED_LOSSES", "SUPPORTED_OPTIMIZERS",
           "load_weights", "state_dict_of", "save_state_dict", "save_adapter"]
