"""A protocol-3 training module's program: its op lists (``oplist``), its state and how the protocol's
methods run them. ``Program`` is the Python twin of the native layer's (native/gradbridge_exported.cpp):
the export's check runs it beside the user's eager model and torch.optim before anything is written.

Graphs (gradbridge.json ``program.graphs``): ``train`` (training mode: forward, loss and backward, one
joint graph; outputs the mutated buffers, ``loss`` and a ``grad:`` per parameter), ``forward`` (eval
mode: ``output``), ``loss`` (the loss of an ``output`` and the ``target``: ``evaluate`` is ``forward``
then ``loss``), ``optimizer`` (one torch.optim step, in place), and for SGD with momentum
``optimizer_first`` (the first step, which creates the momentum buffers).

Methods: ``calculate_loss_and_backward`` runs ``train`` and accumulates the gradients (a parameter without
one takes the new gradient, as autograd's ``AccumulateGrad``); ``zero_grad`` drops them (torch's
``set_to_none``); ``optimizer_step`` increments the step count, computes the optimizer's ``host_scalars``
in double (torch.optim's Python arithmetic, one formula per optimizer) and runs the step graph;
``train_step`` is zero_grad, calculate_loss_and_backward, optimizer_step.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from torch import Tensor

from . import oplist

#: The optimizers protocol 3 exports (torch.optim's single-tensor op sequences, ``export.aten_export``).
OPTIMIZERS = ("sgd", "adam", "adamw")
#: The smallest batch a protocol-3 graph runs (a size-1 batch is one torch.export specializes on).
MIN_BATCH = 2


def host_scalars(name: str, hyper: Mapping[str, Any], lr: float, step: int) -> Dict[str, float]:
    """The per-step doubles torch.optim computes in Python (the specification the native twin follows):
    SGD ``-lr``; Adam/AdamW the bias corrections of step ``step`` (1-based) and AdamW's decay factor."""
    if name == "sgd":
        return {"neg_lr": -lr}
    beta1, beta2 = hyper["betas"]
    step_f = float(step)
    bias_correction1 = 1 - beta1 ** step_f
    bias_correction2 = 1 - beta2 ** step_f
    step_size = lr / bias_correction1
    return {"neg_step_size": -step_size, "bias_correction2_sqrt": bias_correction2 ** 0.5,
            "decay": 1 - lr * hyper["weight_decay"]}


class Program:
    """A protocol-3 module in Python: ``graphs`` by name, ``state`` by binding name, the optimizer."""

    def __init__(self, graphs: Mapping[str, Any], state: Mapping[str, Tensor], parameters: List[str],
                 optimizer: Mapping[str, Any]):
        self.graphs = dict(graphs)
        self.state = {name: t.clone() for name, t in state.items()}
        self.parameters = list(parameters)
        self.optimizer = dict(optimizer)
        self.lr = float(optimizer["lr"])
        self.steps = 0

    def _run(self, graph: str, values: Dict[str, Any]) -> Dict[str, Any]:
        merged = dict(self.state)
        merged.update(values)
        return oplist.run(self.graphs[graph], merged)

    @staticmethod
    def _inputs(x: Mapping[str, Tensor]) -> Dict[str, Tensor]:
        return {f"input:{name}": t for name, t in x.items()}

    def calculate_loss_and_backward(self, x: Mapping[str, Tensor], y: Tensor) -> Tensor:
        out = self._run("train", {**self._inputs(x), "target": y})
        for to, value in out.items():
            if to.startswith("grad:"):
                held = self.state.get(to)
                self.state[to] = value if held is None else held.add_(value)
            elif to.startswith("buffer:"):
                self.state[to] = value
        return out["loss"]

    def zero_grad(self) -> None:
        for name in self.parameters:
            self.state.pop(f"grad:{name}", None)

    def optimizer_step(self) -> None:
        self.steps += 1
        scalars = host_scalars(self.optimizer["name"], self.optimizer, self.lr, self.steps)
        graph = "optimizer_first" if self.steps == 1 and "optimizer_first" in self.graphs else "optimizer"
        out = self._run(graph, {f"scalar:{k}": v for k, v in scalars.items()})
        self.state.update(out)

    def train_step(self, x: Mapping[str, Tensor], y: Tensor) -> Tensor:
        self.zero_grad()
        loss = self.calculate_loss_and_backward(x, y)
        self.optimizer_step()
        return loss

    def forward(self, x: Mapping[str, Tensor]) -> Tensor:
        return self._run("forward", self._inputs(x))["output"]

    def evaluate(self, x: Mapping[str, Tensor], y: Tensor) -> Tensor:
        return self._run("loss", {"output": self.forward(x), "target": y})["loss"]
