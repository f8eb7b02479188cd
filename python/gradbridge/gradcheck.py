"""Are the gradients right? (`gradbridge gradcheck` prints these checks.)

Two checks on one batch of the user's data:

1. **Java against Python.** Java (in this process, same libtorch) runs the module's
   ``calculate_loss_and_backward`` and ``get_gradients``; Python runs the same methods on the
   same file (a protocol-3 module's op lists on the native interpreter's twin, ``program.Program``).
   Same libtorch, same generator seed: they must agree bit for bit.
2. **Analytic against numeric**, like ``torch.autograd.gradcheck``: the model and loss in float64,
   every parameter's autograd gradient against central finite differences of the loss, element
   by element (at most ``max_elements`` per parameter, spread evenly). A custom operator with a
   wrong backward shows up here, named by parameter and element. A protocol-3 module holds op lists
   captured in float32, not a model: this check runs on the user's own model (``model``, the CLI's
   ``--model-factory``) from the module's initial tensors.

Exit code 0 only when both pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence

import numpy as np

from ._runtime import data, inputs, ops, torch_gate
from . import messages, protocol
from .errors import InvalidInputError, ProtocolError

#: Finite-difference step and tolerances: torch.autograd.gradcheck's defaults for float64.
EPS = 1e-6
ATOL = 1e-5
RTOL = 1e-3
#: The seed every loss evaluation starts from, so that dropout draws the same mask each time.
SEED = 0


@dataclass
class ParameterCheck:
    name: str
    elements_checked: int
    elements: int
    max_abs_error: float
    max_rel_error: float
    worst_element: int
    analytic: float
    numeric: float
    ok: bool


def java_gradients(model: str | os.PathLike, x: np.ndarray, y: np.ndarray,
                   op_libraries: Sequence[str | os.PathLike] = ()) -> Dict[str, np.ndarray]:
    """Gradients after one ``calculate_loss_and_backward`` from Java, in this process."""
    import torch

    from . import jvm

    module = jvm.load_module(model, op_libraries)
    try:
        with jvm.java_errors():
            jx, jy = jvm.to_tensor(x), jvm.to_tensor(y)
            try:
                torch.manual_seed(SEED)  # one process, one generator: Java's dropout draws from it
                module.calculateLossAndBackward(jx, jy)
                return {str(k): np.asarray(v, dtype=np.float64) for k, v in module.getGradients().items()}
            finally:
                jx.close()
                jy.close()
    finally:
        module.close()


def python_gradients(model: str | os.PathLike, x: np.ndarray, y: np.ndarray, names: List[str]) -> Dict[str, np.ndarray]:
    """The same methods on the same file, called from Python."""
    import torch

    from ._runtime.torchscript import load, plain_graph_executor

    if protocol.read_metadata(model)["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION:
        return _program_gradients(model, x, y, names)
    module = load(str(model))
    module.train()
    with plain_graph_executor():
        torch.manual_seed(SEED)
        module.calculate_loss_and_backward(torch.from_numpy(x), torch.from_numpy(y))
        grads = module.get_gradients()
    return {name: g.detach().double().numpy().ravel() for name, g in zip(names, grads)}


def _program_gradients(model: str | os.PathLike, x: np.ndarray, y: np.ndarray, names: List[str]
                       ) -> Dict[str, np.ndarray]:
    """A protocol-3 module's ``calculate_loss_and_backward`` on the native interpreter's Python twin."""
    import torch

    from ._runtime.program import Program, read_program

    metadata, graphs, state = read_program(Path(model))
    entry = metadata[protocol.PROGRAM_KEY]
    twin = Program(graphs, state, names, entry["training"], entry["counters"], where=str(model))
    torch.manual_seed(SEED)
    twin.calculate_loss_and_backward({inputs.names(metadata)[0]: torch.from_numpy(x)}, torch.from_numpy(y))
    return {name: twin.state[f"grad:{name}"].double().numpy().ravel() if f"grad:{name}" in twin.state
            else np.zeros(int(np.prod(spec["shape"])))
            for name, spec in zip(names, metadata["parameters"])}


def finite_differences(model: str | os.PathLike, x: np.ndarray, y: np.ndarray, names: List[str],
                       max_elements: int, user_model: Any = None) -> List[ParameterCheck]:
    """Every parameter's float64 autograd gradient against central differences of the loss (on ``user_model``
    from the module's initial tensors when given, else on the model the module stores)."""
    import torch

    from .reference import Reference
    from ._runtime.torchscript import load

    module = Reference(model, user_model) if user_model is not None else load(str(model))
    module.model.train()
    net, loss_fn = module.model.double(), module.loss.double()
    params = list(net.parameters())
    x64 = torch.from_numpy(x).double() if x.dtype.kind == "f" else torch.from_numpy(x)
    y64 = torch.from_numpy(y).double() if y.dtype.kind == "f" else torch.from_numpy(y)

    def loss() -> torch.Tensor:
        torch.manual_seed(SEED)
        return loss_fn(net(x64), y64)

    analytic = torch.autograd.grad(loss(), params, allow_unused=True)
    checks = []
    for name, param, grad in zip(names, params, analytic):
        grad = torch.zeros_like(param) if grad is None else grad
        flat, grad_flat = param.data.view(-1), grad.reshape(-1)
        indices = np.unique(np.linspace(0, flat.numel() - 1, min(max_elements, flat.numel())).astype(np.int64))
        numeric = np.empty(len(indices))
        with torch.no_grad():
            for k, i in enumerate(indices):
                original = flat[i].item()
                flat[i] = original + EPS
                up = loss().item()
                flat[i] = original - EPS
                down = loss().item()
                flat[i] = original
                numeric[k] = (up - down) / (2 * EPS)
        a = grad_flat[torch.from_numpy(indices)].numpy()
        abs_error = np.abs(a - numeric)
        rel_error = abs_error / np.maximum(np.abs(numeric), np.finfo(np.float64).tiny)
        worst = int(np.argmax(abs_error - RTOL * np.abs(numeric)))
        checks.append(ParameterCheck(
            name=name, elements_checked=len(indices), elements=flat.numel(), max_abs_error=float(abs_error.max()),
            max_rel_error=float(rel_error.max()), worst_element=int(indices[worst]), analytic=float(a[worst]),
            numeric=float(numeric[worst]), ok=bool(np.all(abs_error <= ATOL + RTOL * np.abs(numeric)))))
    return checks


@dataclass
class GradcheckResult:
    """Both checks on one batch: Java vs Python autograd, and analytic vs finite differences."""

    samples: int
    parameters: List[str]
    #: parameter -> max |Java - Python| for those that are not bitwise equal
    differing: Dict[str, float]
    checks: List[ParameterCheck]

    @property
    def ok(self) -> bool:
        return not self.differing and all(c.ok for c in self.checks)


def check(model: str | os.PathLike, data_path: str | os.PathLike, *, batch_size: int = 8,
          op_libraries: Sequence[str | os.PathLike] = (), max_elements: int = 64,
          user_model: Any = None) -> GradcheckResult:
    """Both checks on the first ``batch_size`` samples of ``data_path``; ``user_model``: the user's own
    nn.Module for the finite differences (a protocol-3 module needs it: it stores no Python model)."""
    if batch_size < 1:
        raise InvalidInputError(messages.argument("batch_size", "at least 1", batch_size))
    if max_elements < 1:
        raise InvalidInputError(messages.argument("max_elements", "at least 1", max_elements))
    torch_gate.require_torch()  # before any gradient is computed
    metadata = protocol.read_metadata(model)
    if metadata["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION:
        if user_model is None:
            raise ProtocolError(messages.protocol3_needs_model(str(model)))
    ops.prepare(metadata, op_libraries, str(model))
    x, y = data.load_checked(metadata, data_path)
    x, y = np.ascontiguousarray(x[:batch_size]), np.ascontiguousarray(y[:batch_size])
    names = [spec["name"] for spec in metadata["parameters"]]
    in_java = java_gradients(model, x, y, op_libraries)
    in_python = python_gradients(model, x, y, names)
    differing = {name: float(np.max(np.abs(in_java[name] - in_python[name]))) for name in names
                 if not np.array_equal(in_java[name], in_python[name])}
    return GradcheckResult(len(x), names, differing, finite_differences(model, x, y, names, max_elements, user_model))
