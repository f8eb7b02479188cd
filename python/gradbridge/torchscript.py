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
