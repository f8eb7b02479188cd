"""Export an nn.Module as a gradbridge training module (TorchScript + gradbridge.json)."""

from .finetune import load_weights, save_state_dict, state_dict_of
from .training_module import (
    SUPPORTED_LOSSES,
    SUPPORTED_OPTIMIZERS,
    ExportError,
    export_builtin,
    export_training_module,
)

__all__ = ["export_training_module", "export_builtin", "ExportError", "SUPPORTED_LOSSES", "SUPPORTED_OPTIMIZERS",
           "load_weights", "state_dict_of", "save_state_dict"]
