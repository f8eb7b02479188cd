"""The export's check of the written module against the user's own eager nn.Module and torch.optim.

Before the file is renamed into place, the module as Java will load it runs beside an eager copy of the
user's model with the real torch.optim optimizer (``reference.Reference``) on the example batch:

- ``STEPS`` training steps in training mode, each from the same generator seed on both sides: the loss,
  every gradient (and which parameters have one), every parameter, buffer and optimizer-state tensor
  after the step, and the random draws (the ops that consume torch's generator, in order, and the
  generator's state afterwards);
- ``evaluate`` and ``forward`` in eval mode, against ``model.eval()``.

All bit for bit. The first difference is one line naming the method, the tensor, the element and both
values (``messages.export_differs``). The user's model, optimizer and generator are left as they were.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from .. import messages, torchscript
from ..errors import ExportError

#: Training steps compared; two catch what a trace froze at its first call (a counter, a shape).
STEPS = 2
#: The generator seed of step k is SEED + k on both sides.
SEED = 20261202


class _RandomDraws(TorchDispatchMode):
    """Records the ops that draw from torch's generator (tag ``nondeterministic_seeded``), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def _draws_text(ops: Sequence[str]) -> str:
    counts = Counter(ops)
    return ", ".join(f"{op} x{n}" for op, n in counts.items()) if ops else "no draws"


def _first_difference(expected: Tensor, actual: Tensor) -> Optional[int]:
    """The flat index of the first element whose bits differ, else None (same dtype and shape)."""
    if expected.numel() == 0:
        return None
    a = expected.detach().contiguous().reshape(-1).view(torch.uint8).reshape(expected.numel(), -1)
    b = actual.detach().contiguous().reshape(-1).view(torch.uint8).reshape(actual.numel(), -1)
    differ = (a != b).any(dim=1).nonzero()
    return int(differ[0]) if len(differ) else None


def _value(t: Tensor, i: int) -> Any:
    return t.detach().reshape(-1)[i].item()


class _Comparison:
    def __init__(self, capture: str):
        self.capture = capture

    def tensor(self, method: str, name: str, expected: Optional[Tensor], actual: Optional[Tensor]) -> None:
        if expected is None or actual is None:
            if (expected is None) != (actual is None):
                raise ExportError(messages.export_mismatch(method, name, "no tensor" if expected is None else "a tensor",
                                                           "no tensor" if actual is None else "a tensor"))
            return
        if expected.dtype != actual.dtype or list(expected.shape) != list(actual.shape):
            raise ExportError(messages.export_mismatch(method, name, f"{expected.dtype} {list(expected.shape)}",
                                                       f"{actual.dtype} {list(actual.shape)}"))
        i = _first_difference(expected, actual)
        if i is not None:
            raise ExportError(messages.export_differs(method, name, i, _value(expected, i), _value(actual, i),
                                                      self.capture))

    def named(self, method: str, what: str, expected: Dict[str, Tensor], actual: Dict[str, Tensor]) -> None:
        for name, value in expected.items():
            self.tensor(method, f"{what} {name}", value, actual.get(name))

    def draws(self, method: str, eager: List[str], exported: List[str], eager_state: Tensor,
              exported_state: Tensor) -> None:
        if eager != exported or not torch.equal(eager_state, exported_state):
            raise ExportError(messages.export_random_draws(method, _draws_text(eager), _draws_text(exported),
                                                           self.capture))


def check(path: str | os.PathLike, eager_model: nn.Module, x: Tensor, y: Tensor, capture: str) -> None:
    """Compare the module at ``path`` with ``eager_model`` (a copy the check may change) on (x, y)."""
    from ..reference import Reference

    module = torchscript.load_for_python(path)
    reference = Reference(path, eager_model, loaded=module.module)
    module.module.train()
    names = module.parameter_names()
    buffer_names = module.buffer_names()
    compare = _Comparison(capture)
    devices = sorted({t.device.index or 0 for t in (x, y) if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        for step in range(STEPS):
            method = f"train_step {step + 1}"
            torch.manual_seed(SEED + step)
            with _RandomDraws() as eager_draws:
                eager_loss = reference.backward(x, y)
                eager_grads = {n: None if p.grad is None else p.grad.clone() for n, p in reference.model.named_parameters()}
                reference.step()
            eager_state = torch.get_rng_state()
            torch.manual_seed(SEED + step)
            with _RandomDraws() as exported_draws:
                module.zero_grad()
                loss = module.calculate_loss_and_backward(x, y)
                flags = module.gradient_flags().tolist()
                grads = {n: (g if flag else None) for n, g, flag in zip(names, module.get_gradients(), flags)}
                module.optimizer_step()
            compare.draws(method, eager_draws.ops, exported_draws.ops, eager_state, torch.get_rng_state())
            compare.tensor(method, "loss", eager_loss, loss)
            compare.named(method, "gradient of", eager_grads, grads)
            compare.named(method, "parameter", reference.parameters(), dict(zip(names, module.get_parameters())))
            compare.named(method, "buffer", reference.buffers(), dict(zip(buffer_names, module.get_buffers())))
            exported_state = module.optimizer_state()
            for key, values in reference.optimizer_state().items():
                # torch.optim's state order: trainable parameters, group by group
                compare.named(method, f"optimizer state {key} #", {str(i): v for i, v in enumerate(values)},
                              {str(i): v for i, v in enumerate(exported_state.get(key, []))})

        module.module.eval()
        reference.model.eval()
        torch.manual_seed(SEED + STEPS)
        with torch.no_grad():
            expected_loss = reference.loss(reference.model(x), y)
            expected_out = reference.model(x)
        compare.tensor("evaluate (eval mode)", "loss", expected_loss, module.evaluate(x, y))
        with torch.no_grad():
            compare.tensor("forward (eval mode)", "output", expected_out, module.forward(x))
        compare.named("evaluate (eval mode)", "buffer", reference.buffers(),
                      dict(zip(buffer_names, module.get_buffers())))
