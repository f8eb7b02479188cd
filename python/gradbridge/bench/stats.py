"""`gradbridge bench`'s statistics: per-round ratios, bootstrap intervals, verdicts."""

from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np

#: Bootstrap resamples per interval, and the interval's coverage.
BOOTSTRAP_RESAMPLES = 4000
CONFIDENCE = 0.95
MET, MISSED, CANNOT_TELL = "met", "missed", "cannot tell at this noise"


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float], *, seed: int = 0) -> Dict[str, Any]:
    """The ratio of two variants timed in the same rounds, with a bootstrap interval.

    Each round timed both variants back to back, so the per-round ratio cancels what drifts
    between rounds (another process starting, the CPU's clock); the estimate is the median of
    the per-round ratios, and its interval is the percentile bootstrap over rounds (rounds
    resampled with replacement, ``BOOTSTRAP_RESAMPLES`` times).
    """
    a = np.asarray(numerator, dtype=np.float64)
    b = np.asarray(denominator, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError("ratio_ci needs two equally long series of at least 2 rounds")
    ratios = a / b
    resampled = np.random.default_rng(seed).integers(0, len(ratios), (BOOTSTRAP_RESAMPLES, len(ratios)))
    medians = np.median(ratios[resampled], axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return {"ratio": float(np.median(ratios)), "ci95": [float(low), float(high)], "rounds": len(ratios)}


def verdict(ci: Sequence[float], limit: float) -> str:
    """A target "ratio <= limit": met when the whole interval is at or below it, missed when
    the whole interval is above it, and otherwise the rounds cannot tell."""
    low, high = ci
    if high <= limit:
        return MET
    if low > limit:
        return MISSED
    return CANNOT_TELL


def compare(ci: Sequence[float]) -> str:
    """Which way a ratio's interval points: slower (> 1), faster (< 1), or cannot tell."""
    low, high = ci
    if low > 1:
        return "slower"
    if high < 1:
        return "faster"
    return CANNOT_TELL
