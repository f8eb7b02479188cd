"""The export's check of the written module against the user's own eager nn.Module and torch.optim.

Before the file is renamed into place, the module as Java will load it runs beside an eager copy of the
user's model with the real torch.optim optimizer (``reference.Reference``) on the example batch:

- ``STEPS`` training steps in training mode, each from the same generator seed on both sides: the loss,
  every gradient (and which parameters have one), every parameter, buffer and optimizer-state tensor
  after the step, and the random draws (the ops that consume torch's generator, in order, and the
  generator's state afterwards); with gradient accumulation, ``train_step`` against the eager
  micro-batch loop instead (the step consumes the gradients, so they are not compared);
- ``evaluate`` and ``forward`` in eval mode, against ``model.eval()``, before the first step, between the
  steps and after the last (the eager model back in training mode with its own ``train()`` in between);
- a traced model, once more on the example's rows but its last (``evaluate`` and ``forward``, then the training
  loss and its backward): a trace may hold the example's batch size as a constant (HF GPT-2's pooling indexes
  ``torch.arange(batch_size)``), and online micro-batches, predictions and Spark partitions come in any size.
  Skipped where the eager model itself cannot take that batch (BatchNorm training on one row).

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

from .._runtime import autocast, inputs, torchscript
from .. import messages
from ..errors import CaptureError, ExportError
from ..reference import Reference

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


def first_difference(expected: Tensor, actual: Tensor) -> Optional[int]:
    """The flat index of the first element whose bits differ, else None (same dtype and shape): -0.0
    is not 0.0, a NaN only equals the same NaN."""
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
                raise CaptureError(messages.export_mismatch(method, name,
                                                            "no tensor" if expected is None else "a tensor",
                                                            "no tensor" if actual is None else "a tensor"))
            return
        if expected.dtype != actual.dtype or list(expected.shape) != list(actual.shape):
            raise CaptureError(messages.export_mismatch(method, name, f"{expected.dtype} {list(expected.shape)}",
                                                       f"{actual.dtype} {list(actual.shape)}"))
        i = first_difference(expected, actual)
        if i is not None:
            raise CaptureError(messages.export_differs(method, name, i, _value(expected, i), _value(actual, i),
                                                      self.capture))

    def named(self, method: str, what: str, expected: Dict[str, Tensor], actual: Dict[str, Tensor]) -> None:
        for name, value in expected.items():
            self.tensor(method, f"{what} {name}", value, actual.get(name))

    def draws(self, method: str, eager: List[str], exported: List[str], eager_state: Tensor,
              exported_state: Tensor) -> None:
        if eager != exported or not torch.equal(eager_state, exported_state):
            raise CaptureError(messages.export_random_draws(method, _draws_text(eager), _draws_text(exported),
                                                           self.capture))


def _seed(seed: int) -> None:
    """Seed the CPU generator (an export's check runs on the CPU: a CUDA model is exported from a CPU copy,
    ``capture.cpu_copy``)."""
    torch.default_generator.manual_seed(seed)


def _optimizer_state(optimizer: torch.optim.Optimizer, key: str) -> List[Optional[Tensor]]:
    """torch.optim's ``key`` state in the export's layout: a tensor per parameter of the groups that hold
    the key, in group order; None where torch holds none (a parameter that never had a gradient)."""
    values: List[Optional[Tensor]] = []
    for group in optimizer.param_groups:
        states = [optimizer.state.get(p, {}) for p in group["params"]]
        if any(key in state for state in states):
            values.extend(state.get(key) for state in states)
    return values


class _Check:
    """One run of the check; ``method`` names the step under way for a one-line error."""

    def __init__(self, path: str | os.PathLike, eager_model: nn.Module, capture: str):
        self.method = "loading the export"
        self.module = torchscript.load_for_python(path)
        # in training mode; the check's own copy of the model, not copied again
        self.reference = Reference(path, eager_model, loaded=self.module.module, take_model=True)
        self.names = self.module.parameter_names()
        self.buffer_names = self.module.buffer_names()
        self.compare = _Comparison(capture)

    def run(self, x: inputs.Batch, y: Tensor) -> None:
        # eval mode before, between and after the steps: state that lives across calls (an eval-time
        # cache that the eager model's Python train() clears, as timm's LeViT has) shows as a difference
        with torch.random.fork_rng(devices=[]):
            for step in range(STEPS):
                self.method = "evaluate (eval mode)" + (f" after train_step {step}" if step else "")
                self._eval(x, y)
                self.module.module.train()
                self.reference.model.train()
                self.method = f"train_step {step + 1}"
                self._step(x, y, SEED + step)
            self.method = f"evaluate (eval mode) after train_step {STEPS}"
            self._eval(x, y)
            if self.compare.capture == "trace":
                self._other_batch_size(x, y)

    def _other_batch_size(self, x: inputs.Batch, y: Tensor) -> None:
        n = len(y)
        if n < 2:
            return
        index = torch.arange(n - 1)
        part_x, part_y = inputs.select(x, index), y.index_select(0, index)
        module, reference = self.module, self.reference
        for training in (False, True):
            self.method = f"{'train_step' if training else 'evaluate (eval mode)'} on {n - 1} of the example's {n} rows"
            module.module.train(training)
            reference.model.train(training)
            _seed(SEED + STEPS)
            try:  # the eager model first: a batch it cannot take (BatchNorm training on one row) is no test
                with torch.no_grad():
                    reference.loss_of(reference.model, part_x, part_y)
            except Exception:
                return
            try:
                if not training:
                    self._eval(part_x, part_y)
                    continue
                _seed(SEED + STEPS)
                expected = reference.backward(part_x, part_y)
                _seed(SEED + STEPS)
                module.zero_grad()
                loss = module.calculate_loss_and_backward(reference.method_argument(part_x), part_y)
            except ExportError:
                raise
            except Exception as ex:
                raise CaptureError(messages.export_batch_size_frozen(self.method, n, messages.one_line(ex))) from None
            self.compare.tensor(self.method, "loss", expected, loss)

    def _step(self, x: inputs.Batch, y: Tensor, seed: int) -> None:
        module, reference, compare, method = self.module, self.reference, self.compare, self.method
        accumulating = reference.accumulate != 1
        _seed(seed)
        with _RandomDraws() as eager_draws:
            if accumulating:  # train_step's micro-batches; the step consumes the gradients
                eager_loss = reference.train_step(x, y)
            else:
                eager_loss = reference.backward(x, y)
        eager_state = torch.get_rng_state()
        _seed(seed)
        with _RandomDraws() as exported_draws:
            if accumulating:
                loss = module.train_step(reference.method_argument(x), y)
            else:
                module.zero_grad()
                loss = module.calculate_loss_and_backward(reference.method_argument(x), y)
        compare.draws(method, eager_draws.ops, exported_draws.ops, eager_state, torch.get_rng_state())
        compare.tensor(method, "loss", eager_loss, loss)
        if not accumulating:
            # Both sides' gradients compared before either optimizer steps, so neither is copied.
            flags = module.gradient_flags().tolist()
            compare.named(method, "gradient of", {n: p.grad for n, p in reference.model.named_parameters()},
                          {n: (g if flag else None) for n, g, flag in zip(self.names, module.get_gradients(), flags)})
            before = torch.get_rng_state()
            with _RandomDraws() as eager_draws:
                reference.step()
            eager_state = torch.get_rng_state()
            torch.set_rng_state(before)
            with _RandomDraws() as exported_draws:
                module.optimizer_step()
            compare.draws(method, eager_draws.ops, exported_draws.ops, eager_state, torch.get_rng_state())
        compare.named(method, "parameter", reference.parameters(copies=False),
                      dict(zip(self.names, module.get_parameters())))
        compare.named(method, "buffer", reference.buffers(copies=False),
                      dict(zip(self.buffer_names, module.get_buffers())))
        exported_state = module.optimizer_state()
        eager_keys = sorted({key for state in reference.optimizer.state.values() for key, value in state.items()
                             if torch.is_tensor(value)})
        if eager_keys != sorted(exported_state):
            raise CaptureError(messages.export_mismatch(method, "the optimizer state's keys", str(eager_keys),
                                                       str(sorted(exported_state))))
        for key, values in exported_state.items():
            expected = _optimizer_state(reference.optimizer, key)
            if len(expected) != len(values):
                raise CaptureError(messages.export_mismatch(method, f"optimizer state {key}",
                                                            f"{len(expected)} tensors", f"{len(values)} tensors"))
            for i, (mine, theirs) in enumerate(zip(values, expected)):
                if theirs is not None:
                    compare.tensor(method, f"optimizer state {key} #{i}", theirs, mine)

    def _eval(self, x: inputs.Batch, y: Tensor) -> None:
        module, reference, compare = self.module, self.reference, self.compare
        argument = reference.method_argument(x)
        module.module.eval()
        reference.model.eval()
        _seed(SEED + STEPS)
        with torch.no_grad():
            expected_loss = reference.loss_of(reference.model, x, y)
            with autocast.region(reference.autocast):
                expected_out = inputs.call(reference.model, x)
        compare.tensor(self.method, "loss", expected_loss, module.evaluate(argument, y))
        self.method = self.method.replace("evaluate", "forward")
        with torch.no_grad():
            compare.tensor(self.method, "output", expected_out, module.forward(argument))
        compare.named(self.method, "buffer", reference.buffers(copies=False), dict(zip(self.buffer_names, module.get_buffers())))


def check(path: str | os.PathLike, eager_model: nn.Module, x: inputs.Batch, y: Tensor, capture: str) -> None:
    """Compare the module at ``path`` with ``eager_model`` (a copy the check may change) on (x, y)."""
    run: Optional[_Check] = None
    try:
        run = _Check(path, eager_model, capture)
        run.run(x, y)
    except ExportError:
        raise
    except Exception as ex:  # the model raised on one side: still one line, naming where
        reason = messages.one_line(ex)
        raise CaptureError(messages.export_check_raised(run.method if run else "loading the export", reason)) from ex
