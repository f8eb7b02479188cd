"""Capture the user's model for the training module: scripted when TorchScript can script (and save)
it, else traced on the example batch, once in each mode.

A trace freezes the mode it was taken in (dropout on or off, BatchNorm's batch or running statistics),
so a traced model comes as two traces, one taken in training mode for the training step and one in
eval mode for ``forward`` and ``evaluate``; they share the model's parameter and buffer tensors.
Tracing runs the example batch, so the model's buffers (BatchNorm's running statistics) are restored
afterwards and torch's generator is left as it was: the export holds the model's own state.
"""

from __future__ import annotations

import copy
import gc
import os
import linecache
import logging
import re
import traceback
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import torch
from torch import Tensor, nn

from .._runtime import autocast, inputs, torchscript
from .._runtime.devices import example_tensors, model_tensors, off_device  # noqa: F401 (off_device: the exporter's)
from .. import messages
from ..errors import CaptureError, ExportError, TorchScriptUnavailableError

log = logging.getLogger(__name__)

SCRIPT = "script"
TRACE = "trace"


@dataclass
class Capture:
    """The model as the training module runs it: ``train`` in training mode, ``eval`` in eval mode."""

    train: nn.Module
    eval: nn.Module
    kind: str  # SCRIPT or TRACE
    prefix: str = ""  # "model." when captured inside a keyword_call

    def named_buffers(self) -> List[Tuple[str, Tensor]]:
        """The captured model's buffers under the model's own names."""
        return [(name[len(self.prefix):], b) for name, b in self.train.named_buffers()]


_CALL = "NamedInputs"
#: Where a model of several inputs sits inside its keyword call (the scripted module's ``model``)
KEYWORD_PREFIX = "model."
_calls: Dict[Tuple[str, ...], Type[nn.Module]] = {}


def keyword_call(input_names: Sequence[str]) -> Type[nn.Module]:
    """A module class whose forward takes the inputs as a list and passes each to ``self.model`` by
    name: ``self.model(input_ids=xs[0], attention_mask=xs[1])``. TorchScript scripts it (and the model
    with it) from source, so its source is generated and registered in ``linecache`` for
    ``inspect.getsource``, as dataclasses and torch.fx do for the code they generate."""
    key = tuple(input_names)
    if key not in _calls:
        arguments = ", ".join(f"{name}=xs[{i}]" for i, name in enumerate(key))
        source = (f"class {_CALL}(nn.Module):\n"
                  f"    def __init__(self, model: nn.Module):\n"
                  f"        super().__init__()\n"
                  f"        self.model = model\n\n"
                  f"    def forward(self, xs: List[Tensor]) -> Tensor:\n"
                  f"        return self.model({arguments})\n")
        filename = f"<gradbridge inputs {' '.join(key)}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace = {"nn": nn, "List": List, "Tensor": Tensor, "__name__": __name__}
        exec(compile(source, filename, "exec"), namespace)
        _calls[key] = namespace[_CALL]
    return _calls[key]


def _reason(ex: BaseException) -> str:
    """torch's error text on one line: its first line and the first place in the user's code it names
    (the rest is TorchScript's excerpt of that code)."""
    lines = [line.strip() for line in str(ex).splitlines() if line.strip()]
    if not lines:
        return type(ex).__name__
    where = next((line for line in lines[1:] if re.match(r'File ".*", line \d+', line)), None)
    return f"{lines[0].rstrip(':')} ({where})" if where else lines[0]


def uncompiled(model: nn.Module) -> nn.Module:
    """The module under ``torch.compile`` (the same parameters; compiled code is not eager's bits)."""
    original = getattr(model, "_orig_mod", None)
    return original if isinstance(original, nn.Module) and type(model).__name__ == "OptimizedModule" else model


def refuse_captured(model: nn.Module) -> None:
    """A module the user already scripted or traced would run without gradients: refuse it."""
    if isinstance(model, torch.jit.ScriptModule):
        raise ExportError(messages.export_already_captured(
            "traced" if isinstance(model, torch.jit.TracedModule) else "scripted"))


def exported_from(model: nn.Module) -> Optional[str]:
    """The device(s) the model's tensors are on when not the CPU (``cuda:0``), what the metadata records;
    None for a CPU model."""
    found = sorted({str(t.device) for _, t in model_tensors(model)} - {"cpu"})
    return ", ".join(found) if found else None


def cpu_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every parameter and buffer on the CPU (the Parameter objects kept)."""
    copied = copy.deepcopy(model)
    if any(t.device.type != "cpu" for _, t in model_tensors(copied)):
        copied.cpu()
    return copied


def on_cpu(value: Any) -> Any:
    """An example (a tensor, or dicts, lists and tuples of them) with its tensors on the CPU; itself when
    they are there already."""
    if not any(t.device.type != "cpu" for _, t in example_tensors(value, "")):
        return value
    if isinstance(value, Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return type(value)((key, on_cpu(item)) for key, item in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(on_cpu(item) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(on_cpu(item) for item in value)
    return value


def capture(model: nn.Module, example_x: Optional[inputs.Batch], input_names: Sequence[str] = (inputs.X,),
            autocast_dtype: Optional[str] = None) -> Capture:
    """Script ``model``; when scripting or saving the script fails, trace it on ``example_x``. A model
    of several inputs is captured inside ``keyword_call``, which takes them as a list. ``autocast_dtype``:
    traced under ``torch.autocast("cpu", dtype=...)``, which a trace records as the casts it makes (a
    script would run without them)."""
    name = type(model).__name__
    prefix = ""
    if not inputs.is_single(input_names):
        model, prefix = keyword_call(input_names)(model), KEYWORD_PREFIX
        if example_x is not None:
            example_x = inputs.method_argument(example_x, input_names)
    if autocast_dtype is not None:
        train, evaluate = _trace_both_modes(model, example_x, name, messages.AUTOCAST_TRACES, autocast_dtype)
        return Capture(train, evaluate, TRACE, prefix)
    scripted, script_failure = _script(model)
    if scripted is not None:
        return Capture(scripted, scripted, SCRIPT, prefix)
    if example_x is None:
        raise ExportError(messages.export_needs_example(name, script_failure))
    log.warning("scripting %s failed, tracing it on example_inputs instead: %s", name, script_failure)
    train, evaluate = _trace_both_modes(model, example_x, name, script_failure)
    return Capture(train, evaluate, TRACE, prefix)


def traced_loss(loss: nn.Module, output: Tensor, y: Tensor, autocast_dtype: str) -> nn.Module:
    """The loss traced under ``torch.autocast("cpu", dtype=autocast_dtype)`` on the model's ``output``: each
    loss is one torch.nn.functional call, which the trace keeps with the casts autocast makes for it."""
    with autocast.region(autocast_dtype), torch.no_grad():
        return torchscript.trace(loss, (output.detach(), y), check_trace=False)


def _script(model: nn.Module) -> Tuple[Optional[nn.Module], str]:
    """The scripted model, or why scripting (or saving the script) failed."""
    try:
        scripted = torchscript.script(model)
    except TorchScriptUnavailableError:
        raise  # this torch scripts nothing: tracing would not save either
    except OSError as ex:
        if "source" not in str(ex):  # inspect.getsource: TorchScript cannot read the model's code
            raise
        return None, _forget(ex)
    except Exception as ex:  # torch raises several types (NotSupportedError, RuntimeError, ...)
        return None, _forget(ex)
    try:
        # Some models script but cannot be saved (a Python call TorchScript left to Python).
        torchscript.save(scripted, os.devnull)  # streamed: a path, not a buffer the size of the model
    except OSError:
        raise  # the machine's trouble, not the model's
    except Exception as ex:
        return None, _forget(ex)
    return scripted, ""


def _forget(ex: BaseException) -> str:
    """The reason in one line; then the failed compilation's frames are freed here, on this thread.

    A failed ``torch.jit.script`` leaves a ``torch._C.CallStack`` in a frame of the traceback, in a
    reference cycle. Collected later on another thread (the JVM's reference-queue thread in a JPype
    process runs Python), its destructor pops a thread-local stack that is empty there: a segfault in
    ``ErrorReport::CallStack::~CallStack``. So the frames are cleared and the cycles collected now.
    """
    reason = _reason(ex)
    chained: Optional[BaseException] = ex
    seen = set()
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        traceback.clear_frames(chained.__traceback__)
        chained.__traceback__ = None
        chained = chained.__cause__ or chained.__context__
    gc.collect()
    return reason


def _trace_both_modes(model: nn.Module, x: Tensor | List[Tensor], name: str, script_failure: str,
                      autocast_dtype: Optional[str] = None) -> Tuple[nn.Module, nn.Module]:
    """One trace per mode, each in an autocast region of its own (autocast caches the weights it casts
    until its region ends: a second trace in the same region would meet the first one's casts)."""
    was_training = model.training
    saved = [(b, b.clone()) for b in model.buffers()]
    try:
        with torch.random.fork_rng(devices=[]):
            # check_trace=False: torch's own re-run check fails on any random op; the export's check
            # against the eager model replaces it.
            with autocast.region(autocast_dtype):
                train = torchscript.trace(model.train(), (x,), check_trace=False)
            with autocast.region(autocast_dtype):
                evaluate = torchscript.trace(model.eval(), (x,), check_trace=False)
            for traced in (train, evaluate):
                torchscript.save(traced, os.devnull)
    except TorchScriptUnavailableError:
        raise
    except Exception as ex:
        raise CaptureError(messages.export_capture_failed(
            name, "script or trace", f"scripting: {script_failure}; tracing: {messages.libtorch_internal('torch.jit.trace', _forget(ex))}"
        )) from None
    finally:
        model.train(was_training)
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
    return train, evaluate
