"""Compare two training histories epoch by epoch and say plainly how far apart they are."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from .history import History


@dataclass
class EpochDelta:
    epoch: int
    loss_a: float
    loss_b: float
    loss_delta: float
    param_delta: float
    param_name: str


@dataclass
class ParityReport:
    label_a: str
    label_b: str
    rtol: float
    atol: float
    rows: List[EpochDelta] = field(default_factory=list)
    #: first epoch outside rtol/atol, or None
    first_divergence: Optional[int] = None

    @property
    def bitwise(self) -> bool:
        return all(r.loss_delta == 0.0 and r.param_delta == 0.0 for r in self.rows)

    @property
    def within_tolerance(self) -> bool:
        return self.first_divergence is None

    @property
    def max_loss_delta(self) -> float:
        return max((r.loss_delta for r in self.rows), default=0.0)

    @property
    def max_param_delta(self) -> float:
        return max((r.param_delta for r in self.rows), default=0.0)

    def verdict(self) -> str:
        if self.bitwise:
            return f"bitwise identical over {len(self.rows)} epochs"
        if self.within_tolerance:
            return (f"within tolerance (rtol={self.rtol:g}, atol={self.atol:g}) over {len(self.rows)} epochs: "
                    f"max |dloss| {self.max_loss_delta:.3e}, max |dparam| {self.max_param_delta:.3e}")
        row = self.rows[self.first_divergence]
        return (f"diverged at epoch {row.epoch}: loss {row.loss_a!r} vs {row.loss_b!r}, "
                f"parameter {row.param_name} off by {row.param_delta:.3e}")

    def table(self, every: int = 1) -> str:
        header = f"{'epoch':>6}  {'loss ' + self.label_a:>18}  {'loss ' + self.label_b:>18}  {'|dloss|':>10}  {'max |dparam|':>12}  parameter"
        lines = [header]
        for i, r in enumerate(self.rows):
            if i % every == 0 or i == len(self.rows) - 1 or i == self.first_divergence:
                lines.append(f"{r.epoch:>6}  {r.loss_a:>18.9g}  {r.loss_b:>18.9g}  {r.loss_delta:>10.3e}  {r.param_delta:>12.3e}  {r.param_name}")
        lines.append(self.verdict())
        return "\n".join(lines)


def compare_histories(a: History, b: History, *, rtol: float = 0.0, atol: float = 0.0,
                      labels: tuple = ("python", "java")) -> ParityReport:
    """Compare loss and every parameter at every epoch; rtol=atol=0 demands identical values.

    A value pair is within tolerance when ``|a - b| <= atol + rtol * |a|`` (a is the reference).
    Raises ValueError when the histories differ in length or parameter names.
    """
    if len(a) != len(b):
        raise ValueError(f"histories differ in length: {labels[0]} {len(a)} epochs, {labels[1]} {len(b)}")
    report = ParityReport(labels[0], labels[1], rtol, atol)
    for index, (ra, rb) in enumerate(zip(a, b)):
        if ra.epoch != rb.epoch or set(ra.parameters) != set(rb.parameters):
            raise ValueError(f"record {index}: epoch {ra.epoch} with {sorted(ra.parameters)} vs "
                             f"epoch {rb.epoch} with {sorted(rb.parameters)}")
        within = abs(ra.loss - rb.loss) <= atol + rtol * abs(ra.loss)
        worst_name, worst = "-", 0.0
        for name, va in ra.parameters.items():
            vb = rb.parameters[name]
            if va.shape != vb.shape:
                raise ValueError(f"epoch {ra.epoch}: parameter {name} has {va.size} values vs {vb.size}")
            delta = np.abs(va - vb)
            within = within and bool(np.all(delta <= atol + rtol * np.abs(va)))
            if delta.size and float(delta.max()) > worst:
                worst_name, worst = name, float(delta.max())
        report.rows.append(EpochDelta(ra.epoch, ra.loss, rb.loss, abs(ra.loss - rb.loss), worst, worst_name))
        if not within and report.first_divergence is None:
            report.first_divergence = index
    return report
