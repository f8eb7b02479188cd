"""The arithmetic of gradbridge-spark's data-parallel steps that its Python replay (``reference.train_sharded``)
shares with the checks: the step gradient combined from the partitions' (Java: ``GradientCombiner``) and the
digest a data-parallel checkpoint names its data by. ``reference`` exports both under their old names."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from . import data, inputs


def shards_sha256(x, y, shards: int, metadata: Optional[Dict[str, Any]] = None) -> str:
    """A gradbridge-spark checkpoint's ``shards_sha256``: SHA-256 over each partition's SHA-256 of its
    x bytes (``x`` a dict: each input's, in the dict's order, which is to be the module's) then its y
    bytes (partition p holds rows p, p + K, ... in order), in partition order; a 16-bit input's bytes as
    the shards hold it, its dtype's words (``metadata``: the module's, needed for such an input).
    (``data_sha256`` of a single-process run is SHA-256 of all x bytes then all y bytes.)"""
    import hashlib

    arrays = {**inputs.arrays(x), inputs.Y: y}
    if metadata is not None:
        xs, ys = data.tensors(metadata, x, y, "training data")
        arrays = {name: t.view(torch.int16) if t.dtype == torch.bfloat16 else t
                  for name, t in {**inputs.arrays(xs), inputs.Y: ys}.items()}
    outer = hashlib.sha256()
    for p in range(shards):
        inner = hashlib.sha256()
        for array in arrays.values():
            inner.update(np.ascontiguousarray(np.asarray(array)[p::shards]).tobytes())
        outer.update(inner.digest())
    return outer.hexdigest()


def combine_shards(results: Sequence[tuple]) -> tuple:
    """The step gradient of data-parallel training: the sample-weighted sum of the shard
    gradients in partition order (Java: ``dev.gradbridge.spark.GradientCombiner``).

    ``results``: ``(rows, loss, gradients)`` per non-empty shard in partition order, each gradient
    a tensor or None (no gradient). With N the rows of all shards and ``w = rows / N`` (a Python
    float; torch rounds it to a float32 tensor's dtype): per parameter, over the shards that have a
    gradient for it, ``G = g * w`` for the first and ``G = G + g * w`` after, each op rounded to the
    dtype; None when no shard has one. The step loss is ``sum(w * loss)`` in float64, in order.
    """
    total = sum(rows for rows, _, _ in results)
    loss = None
    combined: List[Optional[Tensor]] = [None] * (len(results[0][2]) if results else 0)
    for rows, shard_loss, gradients in results:
        w = rows / total
        loss = w * shard_loss if loss is None else loss + w * shard_loss
        for i, g in enumerate(gradients):
            if g is not None:
                term = g.mul(w)
                combined[i] = term if combined[i] is None else combined[i].add(term)
    return loss, combined
