"""Labelled data for the tests: one function, the same numbers for the same arguments.

Each test file used to carry its own ``_data()``; they differed only in the generator (NumPy's or torch's),
the shape, the number of classes and the rule that turns a row into its label, and those are the parameters
here, so every test still runs on exactly the numbers it ran on before."""

from __future__ import annotations

import numpy as np

#: How a row's label follows from its first features f0, f1, f2 (a row of several dimensions is flattened).
LABELS = {
    "thresholds": "(f0 > 0) + (f1 > 0.5); with classes=2, (f0 > 0) alone",
    "signs": "(f0 > 0) + (f1 > 0)",
    "score": "round(1.3 (2 f0 + f1)), clamped to -1..classes-2, plus 1",
    "mixed": "(f0 + 0.5 f1 > 0) + (f2 > 1)",
    "sum": "(f0 + f2 > 0) + (f1 > 1)",
    "random": "drawn uniformly from 0..classes-1, after the features, from the same generator (x says nothing)",
}


def labelled(n: int, features=6, *, seed: int = 0, tensors: bool = False, labels: str = "thresholds",
             classes: int = 3):
    """``n`` rows of standard normal features and their int64 labels, ``(x, y)``.

    ``features``: the width of a row, or its shape (x is ``(n, *features)``). ``tensors``: torch's generator
    (``torch.Generator().manual_seed(seed)``, float32 tensors) instead of NumPy's (``np.random.default_rng(seed)``,
    float32 arrays); the two draw different numbers. ``labels``: a rule of ``LABELS``; ``classes``: their number,
    where the rule takes one (thresholds, score, random)."""
    assert labels in LABELS, f"labels={labels!r}: one of {sorted(LABELS)}"
    shape = (features,) if isinstance(features, int) else tuple(features)
    if tensors:
        import torch

        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(n, *shape, generator=generator)
        if labels == "random":
            return x, torch.randint(0, classes, (n,), generator=generator)
        return x, _label(x.flatten(1), labels, classes, lambda b: b.long())
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *shape)).astype(np.float32)
    if labels == "random":
        return x, rng.integers(0, classes, n).astype(np.int64)
    return x, _label(x.reshape(n, -1), labels, classes, lambda b: b.astype(np.int64))


def _label(f, rule, classes, as_int64):
    """The labels of rows ``f`` (two dimensions, NumPy or torch) by ``rule``."""
    if rule == "thresholds":
        assert classes in (2, 3), f"thresholds make 2 or 3 classes, not {classes}"
        y = as_int64(f[:, 0] > 0)
        return y if classes == 2 else y + as_int64(f[:, 1] > 0.5)
    if rule == "score":
        score = (f[:, 0] * 2 + f[:, 1]) * 1.3
        if isinstance(score, np.ndarray):
            return as_int64(np.clip(np.round(score), -1, classes - 2)) + 1
        return as_int64(score.round().clamp(-1, classes - 2)) + 1
    if rule == "signs":
        return as_int64(f[:, 0] > 0) + as_int64(f[:, 1] > 0)
    if rule == "mixed":
        return as_int64(f[:, 0] + 0.5 * f[:, 1] > 0) + as_int64(f[:, 2] > 1)
    return as_int64(f[:, 0] + f[:, 2] > 0) + as_int64(f[:, 1] > 1)  # "sum"
