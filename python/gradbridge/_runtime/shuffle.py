"""The mini-batch order and per-epoch torch seed, shared bit for bit with Java.

Specification (Java: ``dev.gradbridge.data.Shuffle``; test vectors: ``tests/vectors/shuffle.json``):

- SplitMix64 (Steele, Lea, Flood 2014; Vigna's reference code): ``state += 0x9E3779B97F4A7C15``;
  ``z = state``; ``z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9``; ``z = (z ^ z >> 27) * 0x94D049BB133111EB``;
  output ``z ^ z >> 31``; all arithmetic modulo 2**64.
- One stream per (seed, epoch), starting at ``state = seed ^ (epoch * 0xD1B54A32D192ED03)``.
- Its first output, shifted right by one bit, seeds libtorch's generator for that epoch
  (``torch.manual_seed``), so dropout draws the same masks in both languages and on resume.
- The following outputs drive Fisher-Yates (Durstenfeld): for ``i`` from ``n - 1`` down to 1,
  ``j = output % (i + 1)``, swap ``perm[i]`` and ``perm[j]``, starting from ``0..n-1``. (The
  modulo bias is below n / 2**64.)
"""

from __future__ import annotations

from typing import List

MASK = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
EPOCH_MIX = 0xD1B54A32D192ED03


class SplitMix64:
    def __init__(self, state: int):
        self.state = state & MASK

    def next(self) -> int:
        self.state = (self.state + GOLDEN_GAMMA) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def _stream(seed: int, epoch: int) -> SplitMix64:
    return SplitMix64((seed & MASK) ^ ((epoch * EPOCH_MIX) & MASK))


def torch_seed(seed: int, epoch: int) -> int:
    """The libtorch generator seed for ``epoch`` (non-negative, below 2**63)."""
    return _stream(seed, epoch).next() >> 1


def permutation(seed: int, epoch: int, n: int) -> List[int]:
    """The sample order of ``epoch``: a permutation of ``range(n)``."""
    stream = _stream(seed, epoch)
    stream.next()  # the first output is the epoch's torch seed
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = stream.next() % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def step_seed(seed: int, *ids: int) -> int:
    """The generator seed of one step of a run: ``torch_seed`` chained over ``ids`` (an online
    micro-batch's number; a Spark step's number, then its partition). Java:
    ``dev.gradbridge.internal.SeededDraws.seed``."""
    for step_id in ids:
        seed = torch_seed(seed, step_id)
    return seed
