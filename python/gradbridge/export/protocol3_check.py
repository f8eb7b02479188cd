"""Protocol 3's export check: the written program (read back, run by the native interpreter's Python twin,
``program.Program``) against the user's eager model with torch.optim as ``reference.Reference`` trains it
(groups, frozen parameters, clipping, accumulation, the schedule): two steps at the example's size (one for a
model of ``self_check.LEAN_CHECK_BYTES`` or more), one at one more (and one at one sample when the program holds
its graphs), each followed by the end-of-epoch schedule step; then evaluate and forward in eval mode at the
example's size (and at one sample); bit for bit.

The two sides run one after the other (``check_trail``: the eager one recorded, the program compared with the
record), so the check holds one of them at a time beside the user's model; the eager copy starts from the user's
values and the init weights, as the export's own copy did (``self_check.eager_copy``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch import Tensor, nn

from .._runtime import autocast, inputs as model_inputs, program
from .. import protocol
from ..errors import ExportError
from ..reference import Reference
from . import self_check
from . import check_trail as trail

#: What the eager side is said to hold for optimizer state only the program has.
_TORCH_HOLDS_NONE = "none (torch.optim holds none)"


def grow(batch: Tensor) -> Tensor:
    """The batch with its first row again at the end (one more sample, real data): the capture's second size
    and the check's third step."""
    return torch.cat([batch, batch[:1]])


class _Eager:
    """The eager side: a copy of the user's model (with the export's init weights), as the export's own was."""

    def __init__(self, path: Path, model: nn.Module, input_names: List[str], init_weights: Any):
        copied = self_check.eager_copy(model, init_weights)
        self.reference = Reference(path, copied, take_model=True, state=self_check.own_state(copied))
        self.names = input_names

    def _batch(self, x: Dict[str, Tensor]) -> Any:
        """Inputs by name as the reference takes them: the tensor itself for a model of one input."""
        return x[self.names[0]] if model_inputs.is_single(self.names) else x

    def train_step(self, x: Dict[str, Tensor], y: Tensor) -> Tensor:
        if self.reference.accumulate != 1:
            return self.reference.train_step(self._batch(x), y)
        loss = self.reference.backward(self._batch(x), y)  # train_step's two halves, ...
        trail.trim()  # ... the backward's activations handed back before the optimizer's temporaries come
        self.reference.step()
        return loss

    def parameters(self) -> Dict[str, Tensor]:
        return self.reference.parameters(copies=False)

    def buffers(self) -> Dict[str, Tensor]:
        return self.reference.buffers(copies=False)

    def optimizer_state(self) -> Dict[str, Tensor]:
        """torch.optim's per-parameter state tensors by ``KEY:NAME`` (a parameter that never had a gradient
        holds none)."""
        names = {id(p): n for n, p in self.reference.named_parameters()}
        return {f"{key}:{names[id(p)]}": value for p, held in self.reference.optimizer.state.items()
                for key, value in held.items() if torch.is_tensor(value)}

    def end_epoch(self, metric: float) -> None:
        self.reference.end_epoch(metric)

    def lrs(self) -> List[float]:
        return self.reference.lrs()

    def evaluate(self, x: Dict[str, Tensor], y: Tensor) -> Tensor:
        return self.reference.evaluate(self._batch(x), y)

    def forward(self, x: Dict[str, Tensor]) -> Tensor:
        self.reference.model.eval()
        with torch.no_grad(), autocast.region(self.reference.autocast):  # as exported (capture.autocast)
            return model_inputs.call(self.reference.model, self._batch(x))


class _Twin:
    """The program's side: the file read back (its state the twin's own, not copied)."""

    def __init__(self, path: Path, schedule: Any):
        metadata, graphs, state = program.read_program(path)
        entry = metadata[protocol.PROGRAM_KEY]
        self.twin = program.Program(graphs, state, [p["name"] for p in metadata["parameters"]], entry["training"],
                                    entry["counters"], copy.deepcopy(schedule), own=True)

    def train_step(self, x: Dict[str, Tensor], y: Tensor) -> Tensor:
        if int(self.twin.training["accumulate"]) != 1:
            return self.twin.train_step(x, y)
        self.twin.zero_grad()  # train_step's halves, as the eager side's
        loss = self.twin.calculate_loss_and_backward(x, y)
        trail.trim()
        self.twin.optimizer_step()
        return loss

    def parameters(self) -> Dict[str, Tensor]:
        return {n: self.twin.state[f"param:{n}"] for n in self.twin.parameters}

    def _held(self, kind: str) -> Dict[str, Tensor]:
        return {name[len(kind):]: t for name, t in self.twin.state.items() if name.startswith(kind)}

    def buffers(self) -> Dict[str, Tensor]:
        return self._held("buffer:")

    def optimizer_state(self) -> Dict[str, Tensor]:
        return self._held("state:")

    def end_epoch(self, metric: float) -> None:
        self.twin.schedule_epoch(metric)

    def lrs(self) -> List[float]:
        return self.twin.lrs

    def evaluate(self, x: Dict[str, Tensor], y: Tensor) -> Tensor:
        return self.twin.evaluate(x, y)

    def forward(self, x: Dict[str, Tensor]) -> Tensor:
        return self.twin.forward(x)


def _run(side: Any, where: trail.Where, batches: List[Any], evaluated: List[Any]) -> Iterator[trail.Observation]:
    for k, (bx, by) in enumerate(batches):
        where.method = method = f"train_step {k + 1}"
        torch.manual_seed(self_check.SEED + k)
        loss = side.train_step(bx, by)
        yield trail.tensor(method, "loss", loss)
        yield trail.named(method, "parameter", side.parameters())
        yield trail.named(method, "buffer", side.buffers())
        yield trail.named(method, "optimizer state", side.optimizer_state(), extra=_TORCH_HOLDS_NONE)
        side.end_epoch(float(loss))
        yield trail.fact(method, "the learning rates", str(side.lrs()))
    for bx, by in evaluated:
        where.method = f"evaluate (eval mode, {len(by)} samples)"
        yield trail.tensor(where.method, "loss", side.evaluate(bx, by))
        where.method = f"forward (eval mode, {len(by)} samples)"
        yield trail.tensor(where.method, "output", side.forward(bx))


def check(path: Path, model: nn.Module, schedule: Any, input_names: List[str], x: Dict[str, Tensor], y: Tensor,
          one_sample: bool, init_weights: Any = None, limit: Optional[int] = 300) -> None:
    """Compare the program at ``path`` with ``model`` (the user's; the check trains a copy of it, with the export's
    ``init_weights``); ``schedule``: the scheduler module the export built (each run of the twin takes a copy);
    ``one_sample``: the program holds graphs at one sample."""
    batches = [(x, y), (x, y), ({n: grow(t) for n, t in x.items()}, grow(y))]
    if self_check.Plan(model).lean:  # one step at the example's size: the step at one more reads its state
        del batches[1]
    evaluated = [(x, y)]
    if one_sample:
        batches.append(({n: t[:1] for n, t in x.items()}, y[:1]))
        evaluated.append(batches[-1])
    trail.two_runs(lambda where: _run(_Eager(path, model, input_names, init_weights), where, batches, evaluated),
                   lambda where: _run(_Twin(path, schedule), where, batches, evaluated), "export", raised=ExportError,
                   limit=limit)
