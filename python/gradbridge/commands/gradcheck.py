"""`gradbridge gradcheck`: print both gradient checks of ``gradbridge.gradcheck`` and a verdict."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..export.command_line import build_model
from .._runtime.files import atomic_path, check_writable
from ..gradcheck import ATOL, EPS, RTOL, check


def run(model: str | os.PathLike, data_path: str | os.PathLike, *, batch_size: int = 8,
        op_libraries: Sequence[str | os.PathLike] = (), max_elements: int = 64,
        report_path: str | os.PathLike | None = None, model_factory: Optional[str] = None,
        out: Callable[[str], None] = print) -> int:
    """Print both checks and a verdict; returns the exit code (0: both pass). ``model_factory``
    (``MODULE:FACTORY``): the user's own nn.Module for the finite differences."""
    if report_path is not None:
        check_writable(report_path)
    user_model = None if model_factory is None else build_model(model_factory)
    result = check(model, data_path, batch_size=batch_size, op_libraries=op_libraries, max_elements=max_elements,
                   user_model=user_model)
    out(f"gradcheck {Path(model).name}: {result.samples} samples from {Path(data_path).name}")
    if result.differing:
        out("Java vs Python autograd (float32, same module): DIFFER: " +
            ", ".join(f"{n} max |difference| {d:.3e}" for n, d in result.differing.items()))
    else:
        out(f"Java vs Python autograd (float32, same module): bitwise identical for {len(result.parameters)} parameters")
    out(f"finite differences (float64, eps {EPS:g}; pass: |analytic - numeric| <= {ATOL:g} + {RTOL:g} * |numeric|):")
    out(f" {'parameter':<24} {'checked':>9} {'max abs err':>12} {'max rel err':>12} {'worst elem':>10}  verdict")
    for c in result.checks:
        out(f" {c.name:<24} {f'{c.elements_checked}/{c.elements}':>9} {c.max_abs_error:>12.3e} "
            f"{c.max_rel_error:>12.3e} {c.worst_element:>10}  {'ok' if c.ok else 'WRONG'}")
    wrong = [c for c in result.checks if not c.ok]
    if result.ok:
        out("verdict: gradients check out")
    else:
        reasons = [f"{c.name} element {c.worst_element}: analytic {c.analytic:.6g}, numeric {c.numeric:.6g}"
                   for c in wrong] + [f"Java and Python differ on {n}" for n in result.differing]
        out("verdict: WRONG GRADIENTS: " + "; ".join(reasons))
    if report_path is not None:
        report = {"model": str(model), "data": str(data_path), "samples": result.samples, "eps": EPS, "atol": ATOL,
                  "rtol": RTOL, "java_vs_python": {"bitwise": not result.differing, "differing": result.differing},
                  "finite_differences": [asdict(c) for c in result.checks], "ok": result.ok}
        path = Path(report_path)
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        out(f"report: {path}")
    return 0 if result.ok else 1
