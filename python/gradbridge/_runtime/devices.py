"""Where a run trains: ``cpu``, ``cuda`` (= ``cuda:0``) or ``cuda:N`` (Java: ``dev.gradbridge.Devices``).

A device string is read once into its canonical form (``cpu``, ``cuda:N``) and checked against this
process's torch before anything trains: a torch without CUDA, or a device index it does not see, is one
line naming the device and why (``messages.device_unavailable``, the sentences Java prints).

On a CUDA device a run is deterministic by default (``deterministic``): ``torch.use_deterministic_algorithms``
on, cuDNN's benchmark off, and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which cuBLAS reads once, when CUDA
starts in the process: set here when unset, with a warning when CUDA has started already. A CPU run
touches none of these.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from typing import TYPE_CHECKING, Iterator, List, Optional, Tuple

from .. import messages
from ..errors import InvalidInputError

if TYPE_CHECKING:  # torch loads where a function needs it, as everywhere in this module
    from torch import Tensor, nn

log = logging.getLogger(__name__)

CPU = "cpu"
_DEVICE = re.compile(r"cpu|cuda(?::(\d{1,9}))?")


def canonical(device: object) -> str:
    """``device`` as ``cpu`` or ``cuda:N``; InvalidInputError for a string that names no device."""
    match = _DEVICE.fullmatch(device) if isinstance(device, str) else None
    if match is None:
        raise InvalidInputError(messages.unknown_device(device))
    return CPU if device == CPU else f"cuda:{int(match.group(1) or 0)}"


def is_cuda(device: str) -> bool:
    return device != CPU


def libtorch() -> str:
    """This torch's build, as the lines name it (``2.7.1+cu126``)."""
    import torch

    return torch.__version__


def driver_loads() -> bool:
    """Whether the NVIDIA driver's library loads (what a CUDA build sees no device without)."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def problem(device: str) -> Optional[str]:
    """Why this process cannot train on ``device`` (canonical), or None."""
    if not is_cuda(device):
        return None
    import torch

    if torch.version.cuda is None:
        from .libtorch import lib_dir

        return messages.cuda_cpu_build(f"{libtorch()} at {lib_dir()}")
    count = torch.cuda.device_count()
    if int(device.split(":")[1]) < count:
        return None
    return messages.cuda_devices_seen(libtorch(), count, count > 0 or driver_loads())


def require(device: object) -> str:
    """``device`` canonical, once this process can train on it; InvalidInputError naming it and why not."""
    device = canonical(device)
    reason = problem(device)
    if reason is not None:
        raise InvalidInputError(messages.device_unavailable(device, reason))
    return device


def cublas_workspace() -> None:
    """``CUBLAS_WORKSPACE_CONFIG`` for reproducible cuBLAS, unless set: before CUDA starts in this process
    (a warning when it started already: cuBLAS read the setting then)."""
    import torch

    if os.environ.get(messages.CUBLAS_WORKSPACE_CONFIG):
        return
    if torch.cuda.is_initialized():
        log.warning(messages.cublas_config_late(None))
    os.environ[messages.CUBLAS_WORKSPACE_CONFIG] = messages.CUBLAS_WORKSPACE_VALUE


@contextlib.contextmanager
def deterministic(device: str, on: bool = True) -> Iterator[None]:
    """For a CUDA device: torch's deterministic algorithms set to ``on`` (and cuDNN's benchmark off) for
    the block, restored after; nothing for the CPU."""
    if not is_cuda(device):
        yield
        return
    import torch

    if on:
        cublas_workspace()
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(on)
    if on:
        torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]


def describe() -> str:
    """For ``gradbridge doctor``: whether this torch is a CUDA build and the devices it sees."""
    import torch

    if torch.version.cuda is None:
        return f"torch {libtorch()} is a CPU build: training on cpu only"
    count = torch.cuda.device_count()
    if count == 0:
        why = "" if driver_loads() else " (no NVIDIA driver: libcuda.so.1 does not load)"
        return f"torch {libtorch()} is a CUDA {torch.version.cuda} build; 0 CUDA devices{why}: training on cpu only"
    names = ", ".join(f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(count))
    return f"torch {libtorch()} is a CUDA {torch.version.cuda} build; {count} CUDA device{'s' if count > 1 else ''}: {names}"


#: The device types a model and its example may be on (an export writes CPU tensors from either).
DEVICE_TYPES = ("cpu", "cuda")


def model_tensors(model: nn.Module) -> List[Tuple[str, Tensor]]:
    """Every parameter and buffer of ``model``, each with what a message calls it."""
    return [*((f"parameter {n}", t) for n, t in model.named_parameters()),
            *((f"buffer {n}", t) for n, t in model.named_buffers())]


def off_device(model: nn.Module, example_inputs: object = None) -> Optional[str]:
    """The line refusing the first parameter, buffer or example tensor on a device other than the CPU or
    CUDA, or None (``messages.unsupported_device``)."""
    for what, tensor in [*model_tensors(model), *example_tensors(example_inputs, "example_inputs")]:
        if tensor.device.type not in DEVICE_TYPES:
            return messages.unsupported_device(what, str(tensor.device))
    return None


def example_tensors(value: object, where: str) -> List[Tuple[str, Tensor]]:
    """The tensors in an example (tensors, dicts, lists and tuples of them), each with where it sits."""
    from torch import Tensor

    if isinstance(value, Tensor):
        return [(where, value)]
    if isinstance(value, dict):
        return [t for key, item in value.items() for t in example_tensors(item, f"{where}[{key!r}]")]
    if isinstance(value, (list, tuple)):
        return [t for i, item in enumerate(value) for t in example_tensors(item, f"{where}[{i}]")]
    return []
