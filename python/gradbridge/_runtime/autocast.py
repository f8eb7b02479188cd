"""``export_training_module(..., autocast=torch.bfloat16)``: the model's forward and its loss under
``torch.autocast("cpu", dtype=...)``, as a user writes mixed precision in eager PyTorch::

    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()

The export captures the casts autocast makes (TorchScript: a trace taken under autocast; protocol 3: the
graphs captured under it), so Java runs them without autocast; the metadata's ``capture`` records the dtype
(``protocol.AUTOCAST_KEY``) for the eager reference, which trains under the same region.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, ContextManager, Dict, Optional

import torch

from .. import messages, protocol

DEVICE = "cpu"


def dtype_name(dtype: Any) -> Optional[str]:
    """The metadata's name of an ``autocast=`` argument (None: no autocast), or a ValueError in one line for
    what CPU autocast does not take (torch would warn and run without it)."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch warns and disables itself for a dtype it does not take
                with torch.autocast(DEVICE, dtype=dtype):
                    taken = torch.is_autocast_enabled(DEVICE) and torch.get_autocast_dtype(DEVICE) == dtype
        except (RuntimeError, ValueError, AssertionError):  # a torch that raises instead
            taken = False
        if taken:
            return protocol.dtype_name(dtype)
    raise ValueError(messages.autocast_refused(dtype))


def of(metadata: Dict[str, Any]) -> Optional[str]:
    """The dtype a module's forward and loss run under autocast (None: none), as its metadata records it."""
    return metadata.get(protocol.CAPTURE_KEY, {}).get(protocol.AUTOCAST_KEY)


def region(name: Optional[str]) -> ContextManager[Any]:
    """``torch.autocast("cpu", dtype=name)``, or no region for None."""
    return torch.autocast(DEVICE, dtype=getattr(torch, name)) if name else contextlib.nullcontext()
