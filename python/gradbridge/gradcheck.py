"""`gradbridge gradcheck`: are the gradients right?

Two checks on one batch of the user's data:

1. **Java against Python.** Java (in this process, same libtorch) runs the module's
   ``calculate_loss_and_backward`` and ``get_gradients``; Python runs the same methods on the
   same file. Same libtorch, same generator seed: they must agree bit for bit.
2. **Analytic against numeric**, like ``torch.autograd.gradcheck``: the model and loss in float64,
   every parameter's autograd gradient against central finite differences of the loss, element
   by element (at most ``max_elements`` per parameter, spread evenly). A custom operator with a
   wrong backward shows up here, named by parameter and element.

Exit code 0 only when both pass.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import numpy as np

from . import data, ops, protocol

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
            manager = module.getManager().newSubManager()
            try:
                torch.manual_seed(SEED)  # one process, one generator: Java's dropout draws from it
                module.calculateLossAndBackward(jvm.to_ndarray(manager, x), jvm.to_ndarray(manager, y))
                return {str(k): np.asarray(v, dtype=np.float64) for k, v in module.getGradients().items()}
            finally:
                manager.close()
    finally:
        module.close()


def python_gradients(model: str | os.PathLike, x: np.ndarray, y: np.ndarray, names: List[str]) -> Dict[str, np.ndarray]:
    """The same methods on the same file, called from Python."""
    import torch

    from .torchscript import plain_graph_executor

    module = torch.jit.load(str(model))
    module.train()
    with plain_graph_executor():
        torch.manual_seed(SEED)
        module.calculate_loss_and_backward(torch.from_numpy(x), torch.from_numpy(y))
        grads = module.get_gradients()
    return {name: g.detach().double().numpy().ravel() for name, g in zip(names, grads)}


def finite_differences(model: str | os.PathLike, x: np.ndarray, y: np.ndarray, names: List[str],
                       max_elements: int) -> List[ParameterCheck]:
    """Every parameter's float64 autograd gradient against central differences of the loss."""
    import torch

    module = torch.jit.load(str(model))
    module.train()
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


def run(model: str | os.PathLike, data_path: str | os.PathLike, *, batch_size: int = 8,
        op_libraries: Sequence[str | os.PathLike] = (), max_elements: int = 64,
        report_path: str | os.PathLike | None = None, out: Callable[[str], None] = print) -> int:
    """Print both checks and a verdict; returns the exit code (0: both pass)."""
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}")
    if max_elements < 1:
        raise ValueError(f"--max-elements must be at least 1, got {max_elements}")
    metadata = protocol.read_metadata(model)
    ops.prepare(metadata, op_libraries, str(model))
    x, y = data.load_checked(metadata, data_path)
    x, y = np.ascontiguousarray(x[:batch_size]), np.ascontiguousarray(y[:batch_size])
    names = [spec["name"] for spec in metadata["parameters"]]

    in_java = java_gradients(model, x, y, op_libraries)
    in_python = python_gradients(model, x, y, names)
    differing = {name: float(np.max(np.abs(in_java[name] - in_python[name]))) for name in names
                 if not np.array_equal(in_java[name], in_python[name])}
    checks = finite_differences(model, x, y, names, max_elements)

    out(f"gradcheck {Path(model).name}: {len(x)} samples from {Path(data_path).name}")
    if differing:
        out("Java vs Python autograd (float32, same module): DIFFER: " +
            ", ".join(f"{n} max |difference| {d:.3e}" for n, d in differing.items()))
    else:
        out(f"Java vs Python autograd (float32, same module): bitwise identical for {len(names)} parameters")
    out(f"finite differences (float64, eps {EPS:g}; pass: |analytic - numeric| <= {ATOL:g} + {RTOL:g} * |numeric|):")
    out(f" {'parameter':<24} {'checked':>9} {'max abs err':>12} {'max rel err':>12} {'worst elem':>10}  verdict")
    for c in checks:
        out(f" {c.name:<24} {f'{c.elements_checked}/{c.elements}':>9} {c.max_abs_error:>12.3e} "
            f"{c.max_rel_error:>12.3e} {c.worst_element:>10}  {'ok' if c.ok else 'WRONG'}")
    wrong = [c for c in checks if not c.ok]
    if not wrong and not differing:
        out("verdict: gradients check out")
    else:
        reasons = [f"{c.name} element {c.worst_element}: analytic {c.analytic:.6g}, numeric {c.numeric:.6g}"
                   for c in wrong] + [f"Java and Python differ on {n}" for n in differing]
        out("verdict: WRONG GRADIENTS: " + "; ".join(reasons))
    if report_path is not None:
        report = {"model": str(model), "data": str(data_path), "samples": len(x), "eps": EPS, "atol": ATOL,
                  "rtol": RTOL, "java_vs_python": {"bitwise": not differing, "differing": differing},
                  "finite_differences": [asdict(c) for c in checks], "ok": not wrong and not differing}
        path = Path(report_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        out(f"report: {path}")
    return 0 if not wrong and not differing else 1
