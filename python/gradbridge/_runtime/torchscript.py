"""TorchScript as gradbridge uses it: the execution settings exact parity depends on, and the
scripting, saving and loading calls of gradbridge's own code (export, reference, gradcheck)."""

from __future__ import annotations

import io
import re
import warnings
from contextlib import contextmanager
from typing import Iterator

import torch

from .. import messages
from ..errors import TorchScriptUnavailableError

# torch deprecates TorchScript (2.11.0 and 2.15.0 do; 2.7.1 does not): every torch.jit.script/trace/save/
# load call warns (FutureWarning;
# DeprecationWarning for some helpers) "`torch.jit.X` is deprecated. Please switch to ...". gradbridge's
# calls are intentional (its protocol is TorchScript; docs/protocol3.md has the plan for its
# removal, and `gradbridge doctor` reports the status), so they are silenced here, for these calls
# only: a user's own torch.jit calls and every other warning still show. (catch_warnings changes
# the process's filters while it is active; gradbridge makes these calls from one thread.)
_DEPRECATION = r"`(torch\.jit\.\w+)` is (deprecated|not supported in Python)"


@contextmanager
def _intentional() -> Iterator[None]:
    with warnings.catch_warnings():
        for category in (FutureWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", message=_DEPRECATION, category=category)
        yield


def script(obj):
    """``torch.jit.script(obj)`` without torch's deprecation warning; TorchScriptUnavailableError when
    this torch refuses scripting altogether (not just this object)."""
    with _intentional():
        try:
            return torch.jit.script(obj)
        except Exception as ex:
            _raise_if_unavailable("torch.jit.script", ex)
            raise


def trace(model, example_inputs, **kwargs):
    """``torch.jit.trace(model, example_inputs, **kwargs)`` without torch's deprecation warning."""
    with _intentional():
        return torch.jit.trace(model, example_inputs, **kwargs)


def save(module, path, **kwargs) -> None:
    """``torch.jit.save(module, path, **kwargs)`` without torch's deprecation warning."""
    with _intentional():
        torch.jit.save(module, path, **kwargs)


def load(path, **kwargs):
    """``torch.jit.load(path, **kwargs)`` without torch's deprecation warning; TorchScriptUnavailableError
    when this torch refuses loading altogether (not just this file); ProtocolError (one line) for a
    protocol-3 module, which is not TorchScript."""
    _refuse_protocol3(path)
    with _intentional():
        try:
            return torch.jit.load(path, **kwargs)
        except Exception as ex:
            _raise_if_unavailable("torch.jit.load", ex)
            raise


def _refuse_protocol3(path) -> None:
    import os
    import zipfile

    from .. import messages
    from ..errors import ProtocolError
    from ..protocol import METADATA_FILE

    if isinstance(path, (str, os.PathLike)) and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            if METADATA_FILE in archive.namelist():
                raise ProtocolError(messages.protocol3_not_torchscript(str(path)))


class _Probe(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def _round_trip() -> None:
    """Script, save and load a one-line module in memory, as gradbridge's export and loading do."""
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(_Probe()), buffer)
    buffer.seek(0)
    torch.jit.load(buffer)


def _unavailable(call: str, ex: Exception) -> TorchScriptUnavailableError:
    return TorchScriptUnavailableError(messages.torchscript_unavailable(
        torch.__version__, call, f"{type(ex).__name__}: {messages.one_line(ex)}"))


def require_available() -> None:
    """TorchScriptUnavailableError (one line) when this torch refuses torch.jit.script, save or load."""
    for call, attempt in (("torch.jit.script", lambda: torch.jit.script(_Probe())), ("torch.jit.load", _round_trip)):
        try:
            with _intentional():
                attempt()
        except Exception as ex:
            raise _unavailable(call, ex) from ex


def _raise_if_unavailable(call: str, ex: Exception) -> None:
    """After ``call`` failed with ``ex``: TorchScriptUnavailableError when a one-line module fails too
    (this torch no longer runs TorchScript), else nothing (the caller's object or file is at fault)."""
    try:
        require_available()
    except TorchScriptUnavailableError:
        raise _unavailable(call, ex) from ex


def deprecation_status() -> str:
    """The installed torch's TorchScript status in words, probed by scripting, saving and loading a
    one-line module (`gradbridge doctor`); TorchScriptUnavailableError when this torch refuses them."""
    require_available()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _round_trip()
    warned = sorted({re.search(_DEPRECATION, str(w.message)).group(1) for w in caught
                     if issubclass(w.category, (FutureWarning, DeprecationWarning))
                     and re.search(_DEPRECATION, str(w.message))})
    if not warned:
        return "supported (torch.jit.script, save and load give no deprecation warning)"
    return (f"deprecated ({', '.join(warned)} warn: please switch to torch.export); gradbridge silences "
            "that warning for its own calls only")


@contextmanager
def plain_graph_executor() -> Iterator[None]:
    """Run scripted methods without the optimizing graph executor (thread-local setting).

    From the second call on, the optimizing executor swaps eager autograd for its own
    differentiable subgraphs, which can differ from eager torch.optim in the last bits. The Java
    side turns it off on every calling thread for the same reason.
    """
    previous = torch._C._get_graph_executor_optimize()
    torch._C._set_graph_executor_optimize(False)
    try:
        yield
    finally:
        torch._C._set_graph_executor_optimize(previous)


class PlainExecutorModule:
    """A loaded training module whose method calls all run under :func:`plain_graph_executor`.

    Attributes that are not methods (``model``, ``lr``, ...) come from the module itself; the
    module is ``.module``. Returned by :func:`load_for_python`.
    """

    def __init__(self, module: torch.jit.ScriptModule):
        self.module = module

    def __getattr__(self, name: str):
        attribute = getattr(self.module, name)
        if not callable(attribute) or isinstance(attribute, torch.nn.Module):
            return attribute

        def plain(*args, **kwargs):
            with plain_graph_executor():
                return attribute(*args, **kwargs)

        plain.__name__ = name
        return plain

    def __call__(self, *args, **kwargs):
        with plain_graph_executor():
            return self.module(*args, **kwargs)


def load_for_python(path, map_location=None) -> PlainExecutorModule:
    """Load an exported training module to drive it from Python, exactly like eager torch.optim.

    ``torch.jit.load(path).train_step(x, y)`` runs under TorchScript's optimizing graph executor,
    which from the second call on swaps eager autograd for its own differentiable subgraphs: an
    Adam or RMSprop module drifts from torch.optim by 1e-8 to 3e-5 within 25 steps. The module
    returned here runs every method with that optimization off (as Java and gradbridge's own
    calls do), so its steps are bit for bit torch.optim's. Equivalent by hand::

        module = torch.jit.load(path)
        with torch.jit.optimized_execution(False):
            loss = module.train_step(x, y)
    """
    return PlainExecutorModule(load(str(path), map_location=map_location))
