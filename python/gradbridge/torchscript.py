"""TorchScript execution settings that exact parity depends on."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


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
    return PlainExecutorModule(torch.jit.load(str(path), map_location=map_location))
