"""What every scripted optimizer is: a TorchScript module, op for op the single-tensor path of torch.optim 2.7.1.

Each class holds its hyper-parameters and per-parameter state: the keys torch.optim's
``optimizer.state[p]`` holds after a step with the same hyper-parameters, no others (SGD without
momentum has none; Adam's ``max_exp_avg_sq`` only with amsgrad; RMSprop's ``momentum_buffer`` only
with momentum, ``grad_avg`` only centered), so a saved module is its parameters, their gradient
buffers and torch's own state. Each has these scripted methods::

    step(params, grads, has_grad)   # under torch.no_grad(); skips parameters without a gradient
    state()                         # {key: [tensor per parameter]}, the live tensors
    allocate(params)                # create the state a momentum set after construction calls for
    held()                          # which parameters hold a key torch.optim creates at their first step
    loaded(held)                    # load_optimizer_state copied a state in, holding those keys so

``has_grad[i]`` is False where torch.optim would see ``p.grad is None`` (the parameter took no
part in the loss since the last ``zero_grad``): such a parameter and its state stay untouched,
as in torch.optim. The docstrings state the update each class performs; the parity tests in
``tests/test_optim.py`` hold them to torch.optim bit for bit.

On CPU, torch.optim defaults to these single-tensor paths (foreach and fused are off for CPU
tensors), so this is the arithmetic a Python user's training actually runs.
"""


from typing import Dict, List, Sequence

import torch
from torch import Tensor, nn


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def zeros_like(params: List[Tensor]) -> List[Tensor]:
    return [torch.zeros_like(p, memory_format=torch.preserve_format).detach() for p in params]


def step_counters(params: Sequence[Tensor]) -> List[Tensor]:
    # torch.optim keeps `step` as a float32 scalar tensor and reads it with .item().
    return [torch.tensor(0.0, dtype=torch.float32) for _ in params]


class ScriptedOptimizer(nn.Module):
    """Hooks for state that depends on a hyper-parameter a schedule can change (OneCycleLR's
    momentum): no-ops here; SGD and RMSprop override them."""

    @torch.jit.export
    def allocate(self, params: List[Tensor]) -> None:
        """Create the state lists the hyper-parameters as they are now call for, if missing (a
        schedule set them after construction); ``step`` and ``load_optimizer_state`` call it first."""
        pass

    @torch.jit.export
    def held(self) -> Dict[str, List[bool]]:
        """For each key of ``state()`` that torch.optim creates at a parameter's first step and whose
        absence changes that step (SGD's momentum_buffer: a copy of the gradient, not an update), which
        parameters hold it now; every parameter holds the keys not listed (their tensors start as torch's
        first step makes them)."""
        none: Dict[str, List[bool]] = {}
        return none

    @torch.jit.export
    def loaded(self, held: Dict[str, List[bool]]) -> None:
        """After ``load_optimizer_state`` copied a state in; ``held``: for each key of ``held()``, which
        parameters that state holds it for."""
        pass
