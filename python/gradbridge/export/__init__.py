"""Export an nn.Module as a gradbridge training module (TorchScript + gradbridge.json)."""

from .training_module import SUPPORTED_LOSSES, SUPPORTED_OPTIMIZERS, export_training_module, export_builtin

__all__ = ["export_training_module", "export_builtin", "SUPPORTED_LOSSES", "SUPPORTED_OPTIMIZERS"]
