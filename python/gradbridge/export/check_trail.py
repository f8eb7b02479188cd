"""The export's check as two runs, one after the other: the user's eager model first, then the written
module, each built afresh, so a large model is held at most once beside the user's own.

A check script (``self_check``'s for TorchScript, ``protocol3_check``'s for protocol 3) runs on one side as a
generator and yields what it sees, in order: tensors (a loss, a gradient, a parameter, optimizer state),
facts (the optimizer state's keys, the learning rates) and random draws. Of the eager run, the record keeps
each tensor's dtype, shape and the SHA-256 of its bytes, nothing of its values; the module's run is compared
with that record as it goes, bit for bit. Where the bits differ, the module's tensor is kept (that tensor
alone), the module let go, and the eager run repeated from the start up to that point, so the one line names
the first element that differs and both values, as a side-by-side comparison would.

A tensor's digest is over its bytes as they are (dtype and shape kept beside it): -0.0 is not 0.0, a NaN
equals only the same NaN. A group's tensors, and a large tensor's pieces, are hashed on several threads.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import gc
import hashlib
import os
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Type

import torch
from torch import Tensor

from .. import messages
from ..errors import CaptureError, ExportError

#: What the record keeps of a tensor: its dtype, shape and digest; None for no tensor.
Seen = Optional[Tuple[torch.dtype, List[int], str]]


#: Bytes of a tensor hashed as one piece: a larger tensor's digest is the SHA-256 of its pieces' SHA-256s. Pieces
#: (and the tensors of a group) are hashed on several threads: hashlib lets go of the GIL.
_PIECE = 1 << 25
_hashing: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _sha256(data: memoryview) -> bytes:
    return hashlib.sha256(data).digest()


def digests(tensors: Sequence[Tensor]) -> List[str]:
    """Each tensor's SHA-256 over its bytes, row-major (a non-contiguous tensor is copied, that tensor alone);
    above ``_PIECE`` bytes, of its pieces' SHA-256s."""
    global _hashing
    flats = [t.detach().cpu().contiguous().reshape(-1) for t in tensors]
    views = [memoryview(f.view(torch.uint8).numpy()) if f.numel() else memoryview(b"") for f in flats]
    pieces = [[data[start:start + _PIECE] for start in range(0, len(data), _PIECE)] or [data] for data in views]
    if _hashing is None:
        _hashing = concurrent.futures.ThreadPoolExecutor(min(4, os.cpu_count() or 1), "gradbridge-digest")
    hashed = iter(_hashing.map(_sha256, [piece for parts in pieces for piece in parts]))
    out = []
    for parts in pieces:
        mine = [next(hashed) for _ in parts]
        out.append(mine[0].hex() if len(mine) == 1 else hashlib.sha256(b"".join(mine)).hexdigest())
    return out


def digest(t: Tensor) -> str:
    return digests([t])[0]


def seen(t: Optional[Tensor]) -> Seen:
    return None if t is None else (t.dtype, list(t.shape), digest(t))


def _seen_all(tensors: Sequence[Optional[Tensor]]) -> List[Seen]:
    present = [t for t in tensors if t is not None]
    hashed = iter(digests(present))
    return [None if t is None else (t.dtype, list(t.shape), next(hashed)) for t in tensors]


def _kind(s: Seen) -> str:
    return "no tensor" if s is None else "a tensor"


def _described(s: Seen) -> str:
    return f"{s[0]} {s[1]}"


def first_difference(expected: Tensor, actual: Tensor) -> Optional[int]:
    """The flat index of the first element whose bits differ, else None (same dtype and shape): -0.0
    is not 0.0, a NaN only equals the same NaN."""
    if expected.numel() == 0:
        return None
    a = expected.detach().contiguous().reshape(-1).view(torch.uint8)
    b = actual.detach().contiguous().reshape(-1).view(torch.uint8)
    if torch.equal(a, b):  # bytes equal: no element differs (and nothing is allocated to say so)
        return None
    differ = (a.reshape(expected.numel(), -1) != b.reshape(actual.numel(), -1)).any(dim=1).nonzero()
    return int(differ[0]) if len(differ) else None


def value_at(t: Tensor, i: int) -> Any:
    return t.detach().reshape(-1)[i].item()


def draws_text(ops: Sequence[str]) -> str:
    counts = Counter(ops)
    return ", ".join(f"{op} x{n}" for op, n in counts.items()) if ops else "no draws"


#: Below this many bytes of parameters and buffers a model's copies are small beside the process: collecting
#: and trimming (``gc.collect`` takes 0.1-1 s in a process holding torch and a JVM) would cost the export more
#: than the pages they hand back.
LARGE_MODEL_BYTES = 64 << 20  # the 45M stand-in of benchmarks/size_bench.py (180 MB) is above it
_large = True


def model_bytes(model: torch.nn.Module) -> int:
    """The bytes of a model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def size_up(model: torch.nn.Module) -> None:
    """Whether the export under way holds a model large enough for ``release`` and ``trim`` to do their work."""
    global _large
    _large = model_bytes(model) >= LARGE_MODEL_BYTES


def release() -> None:
    """Collect what just went out of use (a side, the export's copy) and hand the freed pages back to the system,
    so the next side's tensors do not come on top of the holes the last one left in the heap (large models)."""
    if _large:
        gc.collect()
        trim()


def trim() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere a no-op): between the
    phases of a step (a backward's activations, an optimizer's temporaries), so what the next allocates is
    counted once, not on top of the holes the last left (large models)."""
    if _large and _trim is not None:
        _trim(0)


def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_trim = _malloc_trim()


class Where:
    """The method of the check under way (``train_step 1``, ``evaluate (eval mode)``), for its one line."""

    def __init__(self) -> None:
        self.method = "loading the export"


#: One thing a check script saw: (kind, method, name, payload, option). Kinds: ``tensor`` (a tensor or None),
#: ``named`` (tensors by name, compared by the eager side's names; option: what the eager side is said to hold
#: for a name only the module has, which is then refused, or None: such names are not compared), ``fact`` (a
#: short text compared for equality) and ``draws`` (the random ops, in order, and the generator's state after).
Observation = Tuple[str, str, str, Any, Any]
#: A check script's run on one side: builds the side, yields what it sees (``Observation``s), and lets the side
#: go when it ends or is closed.
Run = Callable[[Where], Iterator[Observation]]


def tensor(method: str, name: str, t: Optional[Tensor]) -> Observation:
    return ("tensor", method, name, t, None)


def named(method: str, what: str, tensors: Dict[str, Optional[Tensor]], extra: Optional[str] = None) -> Observation:
    return ("named", method, what, tensors, extra)


def fact(method: str, name: str, value: str) -> Observation:
    return ("fact", method, name, value, None)


def draws(method: str, ops: Sequence[str], state: Tensor) -> Observation:
    return ("draws", method, "", (list(ops), state), None)


def _recorded(kind: str, payload: Any) -> Any:
    """What the record keeps of an observation: no tensor's values."""
    if kind == "tensor":
        return seen(payload)
    if kind == "named":
        return list(zip(payload, _seen_all(list(payload.values()))))
    if kind == "draws":
        return payload[0], digest(payload[1])
    return payload


class _Difference:
    """The module's tensor at ``position`` (``key``: its name in a named group) whose bits differ from the record."""

    def __init__(self, position: int, key: Optional[str], method: str, label: str, actual: Tensor, recorded: str):
        self.position, self.key, self.method, self.label = position, key, method, label
        self.actual, self.recorded = actual, recorded


def _compare(position: int, method: str, label: str, expected: Seen, actual: Optional[Tensor],
             key: Optional[str], hashed: Optional[str] = None) -> Optional[_Difference]:
    """``hashed``: ``actual``'s digest, where already taken."""
    if expected is None or actual is None:
        if (expected is None) != (actual is None):
            raise CaptureError(messages.export_mismatch(method, label, _kind(expected),
                                                        "no tensor" if actual is None else "a tensor"))
        return None
    if expected[0] != actual.dtype or expected[1] != list(actual.shape):
        raise CaptureError(messages.export_mismatch(method, label, _described(expected),
                                                    f"{actual.dtype} {list(actual.shape)}"))
    if (hashed or digest(actual)) != expected[2]:
        return _Difference(position, key, method, label, actual.detach().clone(), expected[2])
    return None


def _compared(position: int, observation: Observation, entry: Tuple[str, str, str, Any],
              capture: str) -> Optional[_Difference]:
    """The module's observation against the eager side's record of it: a mismatch of kind, shape or fact is
    one line at once; a tensor whose bits differ is returned."""
    kind, method, name, payload, option = observation
    if entry[0] != kind or entry[1] != method:  # the two runs ran one script: a bug if they part
        raise ExportError(messages.export_mismatch(method, "the check's sequence", f"{entry[0]} in {entry[1]}", kind))
    recorded = entry[3]
    if kind == "tensor":
        return _compare(position, method, name, recorded, payload, None)
    if kind == "named":
        actual = [payload.get(key) for key, _ in recorded]
        taken = [s[2] if s is not None else None for s in _seen_all(actual)]  # the group's digests, all at once
        for (key, expected), t, hashed in zip(recorded, actual, taken):
            difference = _compare(position, method, f"{name} {key}", expected, t, key, hashed)
            if difference is not None:
                return difference
        more = sorted(set(payload) - {key for key, _ in recorded}) if option is not None else []
        if more:
            raise ExportError(messages.export_mismatch(method, f"{name} {more[0]}", option, "a tensor"))
        return None
    if kind == "fact":
        if recorded != payload:
            raise CaptureError(messages.export_mismatch(method, name, recorded, payload))
        return None
    ops, state = payload
    if recorded[0] != ops or recorded[1] != digest(state):
        raise CaptureError(messages.export_random_draws(method, draws_text(recorded[0]), draws_text(ops), capture))
    return None


def _fetched(observation: Observation, key: Optional[str]) -> Optional[Tensor]:
    kind, _, _, payload, _ = observation
    t = payload if kind == "tensor" else payload.get(key) if kind == "named" else None
    return None if t is None else t.detach().clone()


def _guarded(run: Run, consume: Callable[[Iterator[Observation]], Any], raised: Type[ExportError],
             limit: Optional[int]) -> Any:
    """``consume`` what ``run`` yields, from the generator's state as the check found it; the model's own
    exception is one line (``messages.export_check_raised``) naming where it came."""
    where = Where()
    try:
        with torch.random.fork_rng(devices=[]):
            observations = run(where)
            try:
                return consume(observations)
            finally:
                observations.close()  # a run stopped early lets its side go here
    except ExportError:
        raise
    except Exception as ex:  # the model raised on one side: still one line, naming where
        reason = messages.one_line(ex)
        raise raised(messages.export_check_raised(where.method, reason[:limit] if limit else reason)) from ex


def two_runs(eager: Run, module: Run, capture: str, raised: Type[ExportError] = CaptureError,
             limit: Optional[int] = None) -> None:
    """Run ``eager`` and record what it yields, then ``module``, comparing as it goes; at the first tensor whose
    bits differ, ``eager`` again up to it, and the one line naming the element (``messages.export_differs``). An
    exception of the model's is ``raised`` with ``messages.export_check_raised`` (its reason cut at ``limit``)."""
    def record(seen: Iterator[Observation]) -> List[Tuple[str, str, str, Any]]:
        entries = []
        for kind, method, name, payload, _ in seen:
            entries.append((kind, method, name, _recorded(kind, payload)))
            if kind != "tensor":
                trim()
        return entries

    entries = _guarded(eager, record, raised, limit)
    release()  # the eager side, before the module is loaded

    def compare(seen: Iterator[Observation]) -> Optional[_Difference]:
        for position, observation in enumerate(seen):
            if observation[0] != "tensor":
                trim()
            difference = _compared(position, observation, entries[position], capture)
            if difference is not None:
                return difference
        return None

    differs = _guarded(module, compare, raised, limit)
    release()  # the module: before the eager side runs again, or before the caller trains
    if differs is None:
        return

    def fetch(seen: Iterator[Observation]) -> Optional[Tensor]:
        for position, observation in enumerate(seen):
            if position == differs.position:
                return _fetched(observation, differs.key)
        return None

    expected = _guarded(eager, fetch, raised, limit)
    actual = differs.actual
    i = first_difference(expected, actual) if expected is not None and expected.shape == actual.shape \
        and expected.dtype == actual.dtype else None
    if i is None:  # the eager model did not repeat itself: say what the digests say
        raise CaptureError(messages.export_mismatch(differs.method, differs.label, f"SHA-256 {differs.recorded[:16]}",
                                                    f"SHA-256 {digest(actual)[:16]}"))
    raise CaptureError(messages.export_differs(differs.method, differs.label, i, value_at(expected, i),
                                               value_at(actual, i), capture))
