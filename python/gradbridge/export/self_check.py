"""The export's check of the written module against the user's own eager nn.Module and torch.optim.

Before the file is renamed into place, the module as Java will load it runs the same script as an eager
copy of the user's model with the real torch.optim optimizer (``reference.Reference``) on the example
batch:

- ``STEPS`` training steps in training mode, each from the same generator seed on both sides: the loss,
  every gradient (and which parameters have one), every parameter, buffer and optimizer-state tensor
  after the step, and the random draws (the ops that consume torch's generator, in order, and the
  generator's state afterwards); with gradient accumulation, ``train_step`` against the eager
  micro-batch loop instead (the step consumes the gradients, so they are not compared);
- ``evaluate`` and ``forward`` in eval mode, against ``model.eval()``, before the first step, between the
  steps and after the last (the eager model back in training mode with its own ``train()`` in between);
- a traced model on the example's rows but its last: the loss in eval mode first (a failure there costs no
  step), in training mode last (the training trace's forward, without its backward): a trace may hold the
  example's batch size as a constant (HF GPT-2's pooling indexes ``torch.arange(batch_size)``), and online
  micro-batches, predictions and Spark partitions come in any size. Skipped where the eager model itself cannot
  take that batch (BatchNorm training on one row).

A model of ``LEAN_CHECK_BYTES`` or more gets the lean check (``Plan.lean``), so that its export costs a few
eager steps, not ten (issue 48: at most 5x one eager step besides writing the file): one training step, the
loss in eval mode before it and the loss and output after it, and the smaller batch as above. It keeps what
the check is for at that size (every gradient, parameter, buffer and optimizer-state tensor of a step, eval mode
before and after training, another batch size); it gives up the second step, which catches a trace that froze
a counter of the model's own at its first call.

All bit for bit. The two sides run one after the other (``check_trail``: the eager one recorded, the
module compared with the record), so the check holds one of them at a time beside the user's model (the eager
copy starts from the user's values and the init weights, as the export's own copy did, not from a read of the
file: a file holding other values differs from the first step on); the
module's tensors are read where they live (its parameter list, gradient list and optimizer state),
not through the getters' copies. The first difference is one line naming the method, the tensor, the
element and both values (``messages.export_differs``). The user's model, optimizer and generator are
left as they were.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from .._runtime import autocast, inputs, torchscript
from .. import protocol
from .. import messages
from ..errors import CaptureError, ExportError
from ..reference import Reference
from . import capture as model_capture, finetune
from . import check_trail as trail

#: Training steps compared; two catch what a trace froze at its first call (a counter, a shape).
STEPS = 2
#: Parameters and buffers of this many bytes or more (a 64M-parameter float32 model) get the lean check.
LEAN_CHECK_BYTES = 256 << 20
#: The generator seed of step k is SEED + k on both sides.
SEED = 20261202


class RandomDraws(TorchDispatchMode):
    """Records the ops that draw from torch's generator (tag ``nondeterministic_seeded``), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


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


def eager_copy(model: nn.Module, init_weights: Any = None) -> nn.Module:
    """The check's eager model: a CPU copy of the user's model with the init weights the export loaded into its
    own, so its parameters and buffers start as the file's (a file that holds other values differs from the
    first step on). Its state is given to ``Reference`` as its own tensors, so the file is not read for them."""
    copied = model_capture.cpu_copy(model)
    if init_weights is not None:
        finetune.load_weights(copied, init_weights)
    return copied


def own_state(model: nn.Module) -> Dict[str, Tensor]:
    """A model's parameters and buffers by name, its own tensors (a ``Reference`` state that copies nothing)."""
    return {**{n: p.detach() for n, p in model.named_parameters()}, **{n: b for n, b in model.named_buffers()}}


def live_state(module: torch.jit.ScriptModule) -> Dict[str, Tensor]:
    """A loaded training module's parameters and buffers by name, its own tensors (``get_parameters`` and
    ``get_buffers`` return copies)."""
    params = [getattr(module.params, str(i)) for i in range(len(module.names))]
    return {**dict(zip(module.parameter_names(), params)), **dict(zip(module.buffer_names(), module.buffer_list))}


class _Eager:
    """The check's eager side: a copy of the user's model (with the init weights the export loaded), trained by
    torch.optim."""

    def __init__(self, path: str | os.PathLike, model: nn.Module, init_weights: Any = None):
        copied = eager_copy(model, init_weights)
        self.reference = Reference(path, copied, state=own_state(copied), take_model=True)  # in training mode
        self.accumulating = self.reference.accumulate != 1
        self._output: Optional[Tensor] = None

    def train(self) -> None:
        self.reference.model.train()

    def eval(self) -> None:
        self.reference.model.eval()

    def backward(self, x: inputs.Batch, y: Tensor) -> Tensor:
        return self.reference.backward(x, y)

    def train_step(self, x: inputs.Batch, y: Tensor) -> Tensor:
        return self.reference.train_step(x, y)

    def gradients(self) -> Dict[str, Optional[Tensor]]:
        return {n: p.grad for n, p in self.reference.named_parameters()}

    def step(self) -> None:
        self.reference.step()

    def parameters(self) -> Dict[str, Tensor]:
        return self.reference.parameters(copies=False)

    def buffers(self) -> Dict[str, Tensor]:
        return self.reference.buffers(copies=False)

    def optimizer_state(self) -> Dict[str, List[Optional[Tensor]]]:
        optimizer = self.reference.optimizer
        keys = sorted({key for state in optimizer.state.values() for key, value in state.items()
                       if torch.is_tensor(value)})
        return {key: _optimizer_state(optimizer, key) for key in keys}

    def evaluate(self, x: inputs.Batch, y: Tensor) -> Tensor:
        """The loss in eval mode; its forward's output is ``forward``'s too when it drew nothing."""
        reference = self.reference
        with torch.no_grad(), RandomDraws() as draws:  # Reference.loss_of's autocast regions
            with autocast.region(reference.autocast):
                output = inputs.call(reference.model, x)
            with autocast.region(reference.autocast):
                loss = reference.loss(output, y)
        self._output = None if draws.ops else output
        return loss

    def forward(self, x: inputs.Batch) -> Tensor:
        output, self._output = self._output, None
        if output is None:
            with torch.no_grad(), autocast.region(self.reference.autocast):
                output = inputs.call(self.reference.model, x)
        return output


class _Module:
    """The check's exported side: the written module as loaded back, its tensors read where they live."""

    def __init__(self, path: str | os.PathLike):
        self.loaded = torchscript.load_for_python(path)
        self.module = self.loaded.module
        self.input_names = inputs.names(protocol.read_metadata(path))
        self.names = self.module.parameter_names()
        self.buffer_names = self.module.buffer_names()
        self.accumulating = int(self.module.accumulate) != 1

    def _argument(self, x: inputs.Batch):
        return inputs.method_argument(x, self.input_names)

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()

    def backward(self, x: inputs.Batch, y: Tensor) -> Tensor:
        self.loaded.zero_grad()
        return self.loaded.calculate_loss_and_backward(self._argument(x), y)

    def train_step(self, x: inputs.Batch, y: Tensor) -> Tensor:
        return self.loaded.train_step(self._argument(x), y)

    def gradients(self) -> Dict[str, Optional[Tensor]]:
        return {n: (g if flag else None) for n, g, flag in zip(self.names, self.module.grads, self.module.has_grad)}

    def step(self) -> None:
        self.loaded.optimizer_step()

    def parameters(self) -> Dict[str, Tensor]:
        state = live_state(self.module)
        return {n: state[n] for n in self.names}

    def buffers(self) -> Dict[str, Tensor]:
        return dict(zip(self.buffer_names, self.module.buffer_list))

    def optimizer_state(self) -> Dict[str, List[Tensor]]:
        """``optimizer_state()``'s layout, the optimizers' own tensors: a key torch.optim creates at a
        parameter's first step is left out while none holds it, an empty tensor where one does not."""
        state: Dict[str, List[Tensor]] = {}
        holders: Dict[str, int] = {}
        lazy = set()
        for _, optimizer in self.module.optimizers.named_children():
            held = optimizer.held()
            lazy.update(held)
            for key, values in optimizer.state().items():
                flags = held.get(key)
                listed = state.setdefault(key, [])
                for i, value in enumerate(values):
                    holds = flags is None or flags[i]
                    listed.append(value if holds else torch.empty([0], dtype=value.dtype))
                    holders[key] = holders.get(key, 0) + int(holds)
        return {key: values for key, values in state.items() if holders.get(key, 0) > 0 or key not in lazy}

    def evaluate(self, x: inputs.Batch, y: Tensor) -> Tensor:
        return self.loaded.evaluate(self._argument(x), y)

    def forward(self, x: inputs.Batch) -> Tensor:
        with torch.no_grad():
            return self.loaded.forward(self._argument(x))


class Plan:
    """What the check runs: ``steps`` training steps, with evaluate and forward in eval mode before, between and
    after them; ``lean``: one step, the loss alone before it (``LEAN_CHECK_BYTES``)."""

    def __init__(self, model: nn.Module):
        self.lean = trail.model_bytes(model) >= LEAN_CHECK_BYTES
        self.steps = 1 if self.lean else STEPS


def _run(side, where: trail.Where, x: inputs.Batch, y: Tensor, plan: Plan, fewer: Optional[Dict[str, bool]] = None
         ) -> Iterator[trail.Observation]:
    if fewer is not None:  # first: a trace that froze the batch size is refused before the steps are run
        yield from _fewer_rows(side, where, x, y, fewer, training=False)
    # eval mode before, between and after the steps: state that lives across calls (an eval-time
    # cache that the eager model's Python train() clears, as timm's LeViT has) shows as a difference
    for step in range(plan.steps):
        where.method = "evaluate (eval mode)" + (f" after train_step {step}" if step else "")
        yield from _eval(side, where, x, y, output=not plan.lean)
        side.train()
        where.method = f"train_step {step + 1}"
        yield from _step(side, where.method, x, y, SEED + step)
    where.method = f"evaluate (eval mode) after train_step {plan.steps}"
    yield from _eval(side, where, x, y)
    if fewer is not None:  # last: the steps say first what a random draw or a frozen value changed
        yield from _fewer_rows(side, where, x, y, fewer, training=True)


def _fewer_rows(side, where: trail.Where, x: inputs.Batch, y: Tensor, taken: Dict[str, bool],
                training: bool) -> Iterator[trail.Observation]:
    """A trace on the example's rows but its last, the loss in eval mode or in training mode (``evaluate`` runs
    the module's current mode; the training trace's forward is where a batch size would be frozen): one that
    holds the example's batch size fails here. The eager side runs first and says in ``taken`` whether the model
    itself takes that batch (BatchNorm training on one row does not); the module's side then runs what the eager
    side ran."""
    n = len(y)
    if n < 2:
        return
    index = torch.arange(n - 1)
    part_x, part_y = inputs.select(x, index), y.index_select(0, index)
    where.method = f"{'the training loss' if training else 'evaluate (eval mode)'} on {n - 1} of the example's {n} rows"
    if training:
        side.train()
    else:
        side.eval()
    _seed(SEED + STEPS)
    eager = isinstance(side, _Eager)
    if not eager and not taken.get(where.method):
        return
    try:
        loss = side.evaluate(part_x, part_y)
    except ExportError:
        raise
    except Exception as ex:  # noqa: BLE001 - the module's failure on another batch size is the finding
        if eager:  # a batch the user's model cannot take is no test
            taken[where.method] = False
            return
        raise CaptureError(messages.export_batch_size_frozen(where.method, n, messages.one_line(ex))) from None
    taken[where.method] = True
    yield trail.tensor(where.method, "loss", loss)


def _step(side, method: str, x: inputs.Batch, y: Tensor, seed: int) -> Iterator[trail.Observation]:
    _seed(seed)
    with RandomDraws() as draws:
        # with accumulation, train_step's micro-batches: the step consumes the gradients
        loss = side.train_step(x, y) if side.accumulating else side.backward(x, y)
    yield trail.draws(method, draws.ops, torch.get_rng_state())
    yield trail.tensor(method, "loss", loss)
    if not side.accumulating:
        yield trail.named(method, "gradient of", side.gradients())
        with RandomDraws() as draws:
            side.step()
        yield trail.draws(method, draws.ops, torch.get_rng_state())
    yield trail.named(method, "parameter", side.parameters())
    yield trail.named(method, "buffer", side.buffers())
    state = side.optimizer_state()
    yield trail.fact(method, "the optimizer state's keys", str(sorted(state)))
    for key in sorted(state):
        values = state[key]
        yield trail.fact(method, f"optimizer state {key}", f"{len(values)} tensors")
        # compared by the eager side's: torch.optim holds none for a parameter that never had a gradient
        yield trail.named(method, f"optimizer state {key}", {f"#{i}": v for i, v in enumerate(values) if v is not None})


def _eval(side, where: trail.Where, x: inputs.Batch, y: Tensor, output: bool = True) -> Iterator[trail.Observation]:
    side.eval()
    _seed(SEED + STEPS)
    yield trail.tensor(where.method, "loss", side.evaluate(x, y))
    where.method = where.method.replace("evaluate", "forward")
    if output:
        yield trail.tensor(where.method, "output", side.forward(x))
    yield trail.named(where.method, "buffer", side.buffers())


def check(path: str | os.PathLike, model: nn.Module, x: inputs.Batch, y: Tensor, capture: str,
          init_weights: Any = None) -> None:
    """Compare the module at ``path`` with ``model`` (the user's; the check trains a copy of it, with the export's
    ``init_weights``) on (x, y)."""
    fewer = {} if capture == "trace" else None  # the eager side's verdicts on the smaller batch, for the module's
    plan = Plan(model)
    trail.two_runs(lambda where: _run(_Eager(path, model, init_weights), where, x, y, plan, fewer),
                   lambda where: _run(_Module(path), where, x, y, plan, fewer), capture, raised=CaptureError)
