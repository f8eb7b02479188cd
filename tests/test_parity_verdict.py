"""Parity suite, the verdict itself: "bitwise" means the same bits in every compared field, and
the verdict, ``within_tolerance`` (the exit code) and the figures never contradict each other."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradbridge import History
from gradbridge.history import EpochRecord
from gradbridge.parity import compare_histories

NAN = float("nan")
INF = float("inf")


def _history(losses, values, val=None, lrs=None):
    return History([EpochRecord(i, loss, {"w": np.array(v, dtype=np.float32)},
                                val_loss=None if val is None else val[i], lrs=None if lrs is None else lrs[i])
                    for i, (loss, v) in enumerate(zip(losses, values))])


def _consistent(report):
    """What the CLI prints and what it exits with say the same thing."""
    verdict = report.verdict()
    assert report.bitwise == verdict.startswith("bitwise identical"), verdict
    assert report.within_tolerance == (verdict.startswith("bitwise") or verdict.startswith("within")), verdict
    assert not report.bitwise or report.within_tolerance
    return verdict


def test_identical_runs_are_bitwise():
    a = _history([1.0, 0.5], [[1, 2], [3, 4]], val=[0.9, 0.4], lrs=[[0.1], [0.05]])
    report = compare_histories(a, a)
    assert report.bitwise and report.within_tolerance and report.max_loss_delta == 0.0
    assert _consistent(report) == "bitwise identical over 2 epochs"


def test_a_different_validation_loss_is_not_bitwise_and_the_verdict_says_so():
    a = _history([1.0, 0.5], [[1, 2], [3, 4]], val=[0.9, 0.4])
    b = _history([1.0, 0.5], [[1, 2], [3, 4]], val=[0.9, 0.4000001])
    report = compare_histories(a, b)
    assert not report.bitwise and not report.within_tolerance
    verdict = _consistent(report)
    assert verdict.startswith("diverged at epoch 1") and "validation loss 0.4 (python) vs 0.4000001 (java)" in verdict
    assert report.max_loss_delta == pytest.approx(1e-7)
    loose = compare_histories(a, b, atol=1e-6)
    assert loose.within_tolerance and not loose.bitwise and _consistent(loose).startswith("within tolerance")


def test_a_nan_cannot_hide_a_difference_elsewhere_in_the_parameter():
    a = _history([1.0], [[NAN, 2.0, 3.0]])
    b = _history([1.0], [[NAN, 2.0, 3.5]])
    report = compare_histories(a, b, atol=1.0)  # 0.5 is within atol; the same NaN is the same bits
    assert report.within_tolerance and not report.bitwise
    assert report.rows[0].param_index == 2 and report.rows[0].param_delta == 0.5
    strict = compare_histories(a, b)
    assert not strict.within_tolerance and "parameter w[2] = 3.0 (python) vs 3.5 (java)" in _consistent(strict)
    one_sided = compare_histories(a, _history([1.0], [[1.0, 2.0, 3.0]]), atol=1.0)
    assert not one_sided.within_tolerance and one_sided.rows[0].param_delta == INF
    assert "parameter w[0] = nan (python) vs 1.0 (java)" in _consistent(one_sided)


def test_the_same_nan_everywhere_is_the_same_bits():
    a = _history([NAN], [[NAN, 1.0]])
    report = compare_histories(a, _history([NAN], [[NAN, 1.0]]))
    assert report.bitwise and report.max_loss_delta == 0.0 and _consistent(report)


def test_negative_zero_is_not_bitwise_equal_to_zero():
    report = compare_histories(_history([1.0], [[0.0, 1.0]]), _history([1.0], [[-0.0, 1.0]]))
    assert not report.bitwise and not report.within_tolerance
    assert "parameter w[0] = 0.0 (python) vs -0.0 (java)" in _consistent(report)
    loss = compare_histories(_history([0.0], [[1.0]]), _history([-0.0], [[1.0]]))
    assert not loss.bitwise and "loss 0.0 (python) vs -0.0 (java)" in _consistent(loss)
    # a tolerance compares values, and 0.0 == -0.0
    assert compare_histories(_history([0.0], [[0.0]]), _history([-0.0], [[-0.0]]), atol=1e-9).within_tolerance


def test_identical_infinite_losses_report_a_zero_difference():
    report = compare_histories(_history([INF, INF], [[1.0], [1.0]]), _history([INF, INF], [[1.0], [1.0]]))
    assert report.bitwise and report.max_loss_delta == 0.0
    assert _consistent(report) == "bitwise identical over 2 epochs"
    opposite = compare_histories(_history([INF], [[1.0]]), _history([-INF], [[1.0]]), atol=1.0)
    assert not opposite.within_tolerance and opposite.max_loss_delta == INF and _consistent(opposite)


def test_an_empty_report_is_neither_bitwise_nor_within_tolerance():
    report = compare_histories(History([]), History([]))
    assert not report.bitwise and not report.within_tolerance
    assert _consistent(report) == "nothing compared (0 epochs)"


def test_different_learning_rates_are_a_divergence():
    a = _history([1.0], [[1.0]], lrs=[[0.1]])
    b = _history([1.0], [[1.0]], lrs=[[0.10000000149011612]])
    report = compare_histories(a, b)
    assert not report.bitwise and "learning rates differ by 1.490e-09" in _consistent(report)
    with pytest.raises(ValueError, match="learning rates in one history only"):
        compare_histories(a, _history([1.0], [[1.0]]))


def test_json_figures_are_finite_where_the_bits_agree():
    report = compare_histories(_history([INF], [[NAN]]), _history([INF], [[NAN]]))
    document = report.to_json()
    assert document["bitwise"] and document["within_tolerance"]
    assert document["max_loss_delta"] == 0.0 and not math.isnan(document["max_param_delta"])
