"""Compare two training histories epoch by epoch and say plainly how far apart they are."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from .history import EpochRecord, History

#: Java in a JVM of its own may run another build of libtorch (the pytorch-native-cpu jar's) than pip's: its kernels may
#: round differently in the last bits, so that comparison allows float32-level differences. Java
#: inside the Python process shares the libtorch and is compared exactly (rtol = atol = 0).
SEPARATE_JVM_RTOL = 1e-5
SEPARATE_JVM_ATOL = 1e-6


@dataclass
class EpochDelta:
    epoch: int
    loss_a: float
    loss_b: float
    loss_delta: float
    #: the largest |a - b| over every parameter value, where it is, and both values there
    param_delta: float
    param_name: str
    param_index: int = -1
    param_a: float = 0.0
    param_b: float = 0.0
    val_loss_a: Optional[float] = None
    val_loss_b: Optional[float] = None
    #: the largest |a - b| over the parameter groups' learning rates (when both recorded them)
    lr_delta: float = 0.0
    val_loss_delta: float = 0.0
    #: every compared field (loss, validation loss, parameters or digests, lrs) has the same bits
    same_bits: bool = True
    val_loss_delta: float = 0.0
    #: every compared field (loss, validation loss, parameters or digests, lrs) has the same bits
    same_bits: bool = True


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
        """Every compared field of every epoch has the same bits (-0.0 is not 0.0; NaN only
        matches the same NaN). A report of no epochs proves nothing: not bitwise."""
        return bool(self.rows) and all(r.same_bits for r in self.rows)

    @property
    def within_tolerance(self) -> bool:
        """Every epoch within rtol/atol (both 0: the same bits, so never without ``bitwise``)."""
        return bool(self.rows) and self.first_divergence is None

    @property
    def max_loss_delta(self) -> float:
        """The largest |difference| of training or validation loss (0 where the bits agree)."""
        return max((max(r.loss_delta, r.val_loss_delta) for r in self.rows), default=0.0)

    @property
    def max_param_delta(self) -> float:
        return max((r.param_delta for r in self.rows), default=0.0)

    def verdict(self) -> str:
        if not self.rows:
            return "nothing compared (0 epochs)"
        if self.bitwise:
            return f"bitwise identical over {len(self.rows)} epochs"
        if self.within_tolerance:
            return (f"within tolerance (rtol={self.rtol:g}, atol={self.atol:g}) over {len(self.rows)} epochs: "
                    f"max |dloss| {self.max_loss_delta:.3e}, max |dparam| {self.max_param_delta:.3e}")
        return self.divergence()

    def divergence(self) -> str:
        """The first epoch outside tolerance: losses, parameter, element, both values, difference."""
        if self.first_divergence is None:
            return "no divergence"
        row = self.rows[self.first_divergence]
        if row.param_index >= 0:
            where = (f"parameter {row.param_name}[{row.param_index}] = {row.param_a!r} ({self.label_a}) vs "
                     f"{row.param_b!r} ({self.label_b}), |difference| {row.param_delta:.3e}")
        elif row.param_name != "-":
            where = f"parameter {row.param_name}: digests differ"
        else:
            where = "parameters within tolerance"
        if row.val_loss_a is not None and not _same(row.val_loss_a, row.val_loss_b):
            where += (f"; validation loss {row.val_loss_a!r} ({self.label_a}) vs {row.val_loss_b!r} "
                      f"({self.label_b}), |difference| {row.val_loss_delta:.3e}")
        if row.lr_delta:
            where += f"; learning rates differ by {row.lr_delta:.3e}"
        return (f"diverged at epoch {row.epoch} (rtol={self.rtol:g}, atol={self.atol:g}): loss {row.loss_a!r} "
                f"({self.label_a}) vs {row.loss_b!r} ({self.label_b}), |difference| {row.loss_delta:.3e}; {where}")

    def to_json(self) -> dict:
        """Every figure, for reports."""
        return {
            "labels": [self.label_a, self.label_b], "rtol": self.rtol, "atol": self.atol,
            "bitwise": self.bitwise, "within_tolerance": self.within_tolerance,
            "first_divergence_epoch": None if self.first_divergence is None else self.rows[self.first_divergence].epoch,
            "max_loss_delta": self.max_loss_delta, "max_param_delta": self.max_param_delta,
            "verdict": self.verdict(),
            "epochs": [vars(row) for row in self.rows],
        }

    def table(self, every: int = 1) -> str:
        header = f"{'epoch':>6}  {'loss ' + self.label_a:>18}  {'loss ' + self.label_b:>18}  {'|dloss|':>10}  {'max |dparam|':>12}  parameter"
        lines = [header]
        for i, r in enumerate(self.rows):
            if i % every == 0 or i == len(self.rows) - 1 or i == self.first_divergence:
                lines.append(f"{r.epoch:>6}  {r.loss_a:>18.9g}  {r.loss_b:>18.9g}  {r.loss_delta:>10.3e}  {r.param_delta:>12.3e}  {r.param_name}")
        lines.append(f"{self.label_b}: {self.verdict()}")
        return "\n".join(lines)


def compare_histories(a: History, b: History, *, rtol: float = 0.0, atol: float = 0.0,
                      labels: tuple = ("python", "java")) -> ParityReport:
    """Compare loss and every parameter at every epoch; rtol=atol=0 demands identical values.

    A value pair is within tolerance when it has the same bits or ``|a - b| <= atol + rtol * |a|``
    (a is the reference; with rtol = atol = 0 only the same bits are); losses, validation
    losses, learning rates and every parameter value are compared. Histories that recorded
    digests only are compared by digest: any difference counts as a divergence.
    Raises ValueError when the histories differ in length or parameter names.
    """
    if len(a) != len(b):
        raise ValueError(f"histories differ in length: {labels[0]} {len(a)} epochs, {labels[1]} {len(b)}")
    report = ParityReport(labels[0], labels[1], rtol, atol)
    for index, (ra, rb) in enumerate(zip(a, b)):
        row, within = _compare_records(index, ra, rb, rtol, atol, labels)
        report.rows.append(row)
        if not within and report.first_divergence is None:
            report.first_divergence = index
    return report


def _compare_records(index: int, ra: EpochRecord, rb: EpochRecord, rtol: float, atol: float,
                     labels: tuple) -> Tuple[EpochDelta, bool]:
    """One epoch's row of the report, and whether every value of it is within tolerance."""
    names_a, names_b = set(ra.parameters or ra.digests), set(rb.parameters or rb.digests)
    if ra.epoch != rb.epoch or names_a != names_b:
        raise ValueError(f"record {index}: epoch {ra.epoch} with {sorted(names_a)} vs "
                         f"epoch {rb.epoch} with {sorted(names_b)}")
    if (ra.val_loss is None) != (rb.val_loss is None):
        raise ValueError(f"epoch {ra.epoch}: validation loss in one history only "
                         f"({labels[0]} {ra.val_loss!r}, {labels[1]} {rb.val_loss!r})")
    row = EpochDelta(ra.epoch, ra.loss, rb.loss, _delta(ra.loss, rb.loss), 0.0, "-",
                     val_loss_a=ra.val_loss, val_loss_b=rb.val_loss)
    row.same_bits = _same(ra.loss, rb.loss)
    within = _close(ra.loss, rb.loss, rtol, atol)
    if ra.val_loss is not None:
        row.val_loss_delta = _delta(ra.val_loss, rb.val_loss)
        row.same_bits = row.same_bits and _same(ra.val_loss, rb.val_loss)
        within = within and _close(ra.val_loss, rb.val_loss, rtol, atol)
    if ra.parameters and rb.parameters:
        within = _compare_parameters(ra, rb, row, rtol, atol, labels) and within
    else:  # digests only: they tell equal from different, not by how much
        for name in sorted(names_a):
            if ra.digests.get(name) != rb.digests.get(name):
                within = row.same_bits = False
                row.param_delta, row.param_name = float("inf"), name
    return row, _compare_lrs(ra, rb, row, rtol, atol) and within


def _compare_parameters(ra: EpochRecord, rb: EpochRecord, row: EpochDelta, rtol: float, atol: float,
                        labels: tuple) -> bool:
    """Every parameter value of two records: ``row`` gets the largest difference; whether all are within."""
    within = True
    for name, va in ra.parameters.items():
        vb = rb.parameters[name]
        if va.shape != vb.shape:
            raise ValueError(f"epoch {ra.epoch}: parameter {name} has shape {list(va.shape)} in "
                             f"{labels[0]} but {list(vb.shape)} in {labels[1]}")
        va, vb = _common(va), _common(vb)
        differ = _bits(va) != _bits(vb)
        if not differ.any():
            continue
        row.same_bits = False
        delta = _deltas(va, vb, differ)
        within = within and bool(np.all(~differ | _close_array(va, vb, rtol, atol)))
        # the largest difference, or the first differing element when none has a size (-0.0 vs 0.0)
        i = int(delta.argmax()) if float(delta.max()) > 0 else int(np.flatnonzero(differ)[0])
        if row.param_index < 0 or float(delta[i]) > row.param_delta:
            row.param_delta, row.param_name, row.param_index = float(delta[i]), name, i
            row.param_a, row.param_b = float(va.ravel()[i]), float(vb.ravel()[i])
    return within


def _compare_lrs(ra: EpochRecord, rb: EpochRecord, row: EpochDelta, rtol: float, atol: float) -> bool:
    """Two records' learning rates (schedules: the same lr sequence), into ``row``; whether all are within."""
    if (ra.lrs is None) != (rb.lrs is None):
        raise ValueError(f"epoch {ra.epoch}: learning rates in one history only")
    if ra.lrs is None:
        return True
    if len(ra.lrs) != len(rb.lrs):
        raise ValueError(f"epoch {ra.epoch}: {len(ra.lrs)} parameter groups vs {len(rb.lrs)}")
    row.lr_delta = max((_delta(x, y) for x, y in zip(ra.lrs, rb.lrs)), default=0.0)
    row.same_bits = row.same_bits and all(_same(x, y) for x, y in zip(ra.lrs, rb.lrs))
    return all(_close(x, y, rtol, atol) for x, y in zip(ra.lrs, rb.lrs))


def _same(a: float, b: float) -> bool:
    """The same bits as doubles (NaN == the same NaN; -0.0 != 0.0)."""
    return struct.pack("<d", a) == struct.pack("<d", b)


def _delta(a: float, b: float) -> float:
    """|a - b| for reports: 0 for the same bits (identical infinities too), inf when only one is NaN."""
    if _same(a, b):
        return 0.0
    difference = abs(a - b)
    return float("inf") if math.isnan(difference) else difference


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    """Within ``|a - b| <= atol + rtol * |a|``; with rtol = atol = 0, the same bits."""
    if _same(a, b):
        return True
    if rtol == 0 and atol == 0:
        return False
    return a == b or abs(a - b) <= atol + rtol * abs(a)


def _common(values: np.ndarray) -> np.ndarray:
    """float32 widened to float64 (exact), so that both sides' bits compare in one width."""
    values = np.asarray(values)
    return values.astype(np.float64) if values.dtype != np.float64 else values


def _bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values).ravel().view(np.uint64)


def _deltas(va: np.ndarray, vb: np.ndarray, differ: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.abs(va.ravel() - vb.ravel())
    return np.where(differ, np.where(np.isnan(delta), np.inf, delta), 0.0)


def _close_array(va: np.ndarray, vb: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    if rtol == 0 and atol == 0:
        return np.zeros(va.size, dtype=bool)  # differing bits are never within zero tolerance
    with np.errstate(invalid="ignore", over="ignore"):
        a, b = va.ravel(), vb.ravel()
        return (a == b) | (np.abs(a - b) <= atol + rtol * np.abs(a))


def assert_histories_match(a: History, b: History, *, rtol: float = 0.0, atol: float = 0.0,
                           labels: tuple = ("python", "java")) -> ParityReport:
    """Raise AssertionError naming the first diverging epoch, parameter, both values and the
    difference, unless every epoch is within tolerance (rtol=atol=0: identical). Returns the report."""
    report = compare_histories(a, b, rtol=rtol, atol=atol, labels=labels)
    if not report.within_tolerance:
        raise AssertionError(report.divergence())
    return report
