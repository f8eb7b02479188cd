"""Protocol 3 (``format="export"``) and ``gradbridge state-dict``."""

from __future__ import annotations

from typing import Any


# ---- protocol 3 (export_training_module(..., format="export")) ----

def aten_option_refused(option: str) -> str:
    return f"format='export' does not support {option} yet; export with format='torchscript' or leave it out"


def auto_took_export(reason: str) -> str:
    return f"format='auto' exported protocol 3 (torch.export), as TorchScript cannot: {reason}"


def auto_neither(torchscript: str, export: str) -> str:
    return f"{torchscript}; and protocol 3 (format='export') cannot either: {export}"


def format_chosen(kind: str, by_auto: bool) -> str:
    """Which format an export took, from its capture kind (script, trace, export), in words."""
    if kind == "export":
        return "protocol 3, torch.export" + (": TorchScript cannot capture it" if by_auto else "")
    return f"TorchScript, {'traced' if kind == 'trace' else 'scripted'}"


def aten_optimizer_refused(name: str, supported: Any) -> str:
    return f"format='export' does not support optimizer {name} yet (it exports {', '.join(supported)})"


def aten_capture_failed(model: str, reason: str) -> str:
    return f"torch.export cannot capture {model}'s training step: {reason}"


def aten_data_dependent(at: str) -> str:
    return (f"the model's Python code depends on the values in its tensors (a branch or a size computed from data "
            f"or a random draw), which one graph cannot hold{at}")


def aten_batch_dependent(reason: str) -> str:
    return (f"format='export': the captured graph depends on the batch size beyond its sizes ({reason}); "
            "export with format='torchscript'")


def aten_batch_too_small(batch: int, minimum: int) -> str:
    return f"format='export' needs an example batch of at least {minimum} samples, got {batch}"


def aten_no_gradient(model: str) -> str:
    return f"format='export': no trainable parameter of {model} gets a gradient from the loss; nothing to train"


def aten_unbound(name: str) -> str:
    return f"format='export': a graph reads {name}, which the model does not hold"


def aten_micro_batches_too_small(batch: int, accumulate: int, sizes: Any, minimum: int) -> str:
    return (f"format='export': accumulate={accumulate} splits a batch of {batch} into micro-batches of {sizes}; "
            f"protocol 3 runs micro-batches of at least {minimum} samples for a model it cannot capture at one sample "
            f"(eager refuses one too: BatchNorm in training): pick another example batch size")


def program_entry_missing(path: str, entry: str) -> str:
    return f"{path}: the protocol-3 module lacks {entry} (a truncated or edited file); export it again"


def program_version(path: str, version: Any, supported: int) -> str:
    return f"{path}: op-list version {version}, this gradbridge runs version {supported}; export the model again with this gradbridge"


def program_state_mismatch(path: str, name: str, expected: str, actual: str) -> str:
    return f"{path}: state tensor {name} is {actual}, expected {expected} (an edited file); export it again"


def program_state_bytes(path: str, file: str, size: int, name: str, spec: str, needed: int) -> str:
    return f"{path}: {file} holds {size} bytes, {name} ({spec}) needs {needed} (a truncated or edited file)"


def program_unreadable(path: str, reason: str) -> str:
    return f"{path}: not a readable protocol-3 module: {reason}"


def protocol3_needs_model(path: str) -> str:
    return (f"{path}: a protocol-3 module (format='export') holds no Python model: pass model= (your eager "
            "nn.Module; on the command line --model-factory MODULE:FACTORY) to compare against")


def protocol3_not_torchscript(path: str) -> str:
    return (f"{path}: a protocol-3 module (format='export') is not TorchScript; this command reads TorchScript "
            "modules only for now (Java's TrainingModule and Trainer, java.train and reference.train(model=...) "
            "take it)")


# ---- gradbridge state-dict (export.weights) ----

def weights_suffix(path: str, suffix: str, known: Any) -> str:
    shown = f"suffix '{suffix}'" if suffix else "no suffix"
    return (f"{path}: cannot tell the format from {shown}: name it {known}, or choose one with --format "
            "(format= in Python)")


def weights_format(value: Any, known: Any) -> str:
    return f"state_dict format must be one of {', '.join(known)}, got {value!r}"


def weights_left_out(path: str, count: int, first: str) -> str:
    return (f"{path} leaves out {count} frozen tensors ({first}, ...): an online learner's checkpoint holds what "
            "training changed; pass the module file it learned from as base (gradbridge state-dict --base MODEL)")


def weights_other_base(base: str, name: str, shape: list, path: str) -> str:
    return f"{base}: holds no {name} of shape {shape}, which {path} leaves out: not the module file it learned from"


def weights_nothing_asked() -> str:
    return "state-dict: give -o FILE (the whole state_dict), --adapter DIR (a PEFT model's adapter) or both"


def weights_no_adapter(path: str) -> str:
    return (f"{path}: --adapter: the module records no PEFT adapter (its model holds no peft.PeftModel, or it was "
            "exported before gradbridge recorded adapters: export it again); -o FILE writes the whole state_dict")


def weights_adapter_key(path: str, adapter: str, key: str) -> str:
    return (f"{path}: adapter '{adapter}' names state_dict key {key}, which the module's model lacks "
            "(an edited file); export it again")


def weights_not_recorded(reason: str) -> str:
    return f"the export records no PEFT adapter (gradbridge state-dict --adapter will refuse it): {reason}"
