"""What one training step of the model writes besides its parameters: the buffers it changes and
whether it draws from torch's generator.

The online learner and gradbridge-spark carry the buffers a step writes (BatchNorm's running
statistics and ``num_batches_tracked``) with every version and partition, and leave constant buffers
(HF transformers' ``inv_freq``, ``position_ids``, causal masks) to the module file; a model that
draws random numbers (dropout) is seeded per micro-batch or per step and partition. Both are decided
here from the model itself, by running its forward once in training mode, not from buffer names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, Optional

import torch
from torch import nn

from .._runtime import inputs as model_inputs


@dataclass(frozen=True)
class StepWrites:
    #: names of the buffers a training-mode forward writes (in place, or with other values)
    trained_buffers: FrozenSet[str]
    #: whether a training-mode forward draws from torch's CPU generator
    draws_random: bool


def probe(model: nn.Module, x: Any, then: Optional[Callable[[Any], None]] = None) -> StepWrites:
    """Run ``model``'s forward on ``x`` once in training mode, without autograd, and see what it
    wrote: a buffer whose version counter moved or whose values changed, and the generator's state;
    ``then(output)`` runs on the forward's output (the export's check that the example fits the
    loss). The model's buffers, its training flag and torch's generator are left as they were."""
    buffers = list(model.named_buffers())
    saved = [(b, b.detach().clone(), b._version) for _, b in buffers]
    was_training = model.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            state = torch.get_rng_state()
            model.train()
            output = model_inputs.call(model, x)
            draws = not torch.equal(state, torch.get_rng_state())
            if then is not None:
                then(output)
        trained = frozenset(name for (name, b), (_, before, version) in zip(buffers, saved)
                            if b._version != version or not _same_bits(before, b))
    finally:
        with torch.no_grad():
            for b, before, _ in saved:
                b.copy_(before)
        model.train(was_training)
    return StepWrites(trained, draws)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.detach().reshape(-1).view(torch.uint8)))
