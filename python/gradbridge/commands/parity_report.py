"""Parity reports: a JSON file with every figure and a PNG to read at a glance."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Optional, Sequence

from .._runtime.files import atomic_path
from ..history import History
from ..parity import ParityReport

#: |difference| plotted for bitwise-equal epochs, which a log scale cannot show as 0
_ZERO_FLOOR = 1e-18


def write_json(path: str | os.PathLike, config: Dict, reports: Sequence[ParityReport],
               failures: Optional[Dict[str, str]] = None) -> Path:
    """Every comparison's figures, and the error line of each Java variant that failed."""
    path = Path(path)
    document = {"config": config, "comparisons": [report.to_json() for report in reports],
                "failures": dict(failures or {})}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def write_plot(path: str | os.PathLike, title: str, reference: History, others: Dict[str, History],
               reports: Sequence[ParityReport]) -> Path:
    """Top: loss curves (training, and validation when present) overlaid. Bottom: per-epoch
    max |difference| of loss and parameters on a log scale; bitwise-equal epochs sit on the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    epochs = [r.epoch for r in reference]
    figure, (curves, deltas) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    curves.plot(epochs, reference.losses, "o-", color="tab:blue", lw=3, alpha=0.5, label="python (reference) train")
    styles = ["--", ":", "-."]
    for i, (label, history) in enumerate(others.items()):
        curves.plot(epochs, history.losses, styles[i % 3], marker="x", color="tab:orange" if i == 0 else "tab:red",
                    label=f"{label} train")
    if reference[0].val_loss is not None:
        curves.plot(epochs, [r.val_loss for r in reference], "s-", color="tab:green", alpha=0.5, label="python validation")
        for label, history in others.items():
            curves.plot(epochs, [r.val_loss for r in history], "--", marker="+", color="darkgreen", label=f"{label} validation")
    curves.set_ylabel("loss")
    curves.set_title(title)
    curves.legend()
    curves.grid(alpha=0.3)
    for i, report in enumerate(reports):
        color = "tab:orange" if i == 0 else "tab:red"
        loss = [max(row.loss_delta, _ZERO_FLOOR) for row in report.rows]
        param = [max(row.param_delta, _ZERO_FLOOR) for row in report.rows]
        deltas.semilogy(epochs, loss, "o-", color=color, label=f"|Δ loss| {report.label_b}")
        deltas.semilogy(epochs, param, "s--", color=color, alpha=0.6, label=f"max |Δ parameter| {report.label_b}")
        if report.atol > 0:
            deltas.axhline(report.atol, color=color, lw=0.8, ls=":", label=f"atol {report.label_b}")
    deltas.axhline(_ZERO_FLOOR, color="gray", lw=0.8)
    deltas.text(epochs[-1], _ZERO_FLOOR * 20, "floor = bitwise identical", color="gray", fontsize=8, ha="right")
    deltas.set_ylim(_ZERO_FLOOR / 10, 1.0)
    deltas.set_title("; ".join(f"{r.label_b}: {r.verdict().split(':')[0]}" for r in reports), fontsize=9)
    deltas.set_xlabel("epoch")
    deltas.set_ylabel("|difference| vs python")
    deltas.legend(fontsize=8, loc="upper left")
    deltas.grid(alpha=0.3, which="both")
    figure.tight_layout()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=110, format="png")
    plt.close(figure)
    return path
