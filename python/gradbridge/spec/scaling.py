"""``t.mul_(factor)`` as eager torch.optim computes it, for the scripted optimizers (spec/optim.py).

A Python float passed to ``Tensor.mul_`` in eager code reaches ATen as a wrapped-number tensor
(``aten::mul_.Tensor``), multiplied in float32 for a bfloat16 or float16 tensor; TorchScript calls
``aten::mul_.Scalar``, which rounds the factor to the tensor's dtype first (0.999 is 0.99902 in float16,
0.9 is 0.8984 in bfloat16), so a 16-bit parameter's Adam ``exp_avg_sq.mul_(beta2)`` or SGD momentum
buffer drifted from torch.optim's (issue 46). Other dtypes keep the scalar overload (float64 differs the
other way round)."""

from __future__ import annotations

import torch
from torch import Tensor


def scale_(t: Tensor, factor: float) -> Tensor:
    """``t.mul_(factor)`` bit for bit as eager ``Tensor.mul_(float)``."""
    if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
        return t.mul_(torch.tensor(factor, dtype=torch.float64))
    return t.mul_(factor)
