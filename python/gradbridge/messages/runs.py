"""Training runs, data files, tensors and metadata, API arguments; the one-line rules (``one_line``)."""

from __future__ import annotations

import decimal
import json
import math
import re
from typing import Any, Optional, Sequence


LONG_MAX = (1 << 63) - 1


# ---- training runs ----

def batch_size(n: int, got: int) -> str:
    return f"batch size must be in 1..{n}, got {got}"


# ---- data files (.npz / .npy) ----

def big_endian(source: str, array: str, descr: str) -> str:
    little = "<" + descr[1:]
    return (f"{source}: array {array} has dtype {descr} (big-endian); expected little-endian {little}: "
            f"save it with {array}.astype('{little}')")


def fortran_order(source: str, array: str) -> str:
    return f"{source}: array {array} is stored in Fortran order; expected C order: save numpy.ascontiguousarray({array})"


def npy_size(source: str, array: str, shape: Sequence[int], descr: str, claimed: int, available: int) -> str:
    claimed_text = f"more than {LONG_MAX}" if claimed > LONG_MAX else str(claimed)
    return (f"{source}: array {array} header claims shape [{', '.join(map(str, shape))}] of {descr} "
            f"({claimed_text} bytes) but the file holds {available} bytes")


def npy_header(source: str, array: str, reason: str) -> str:
    return f"{source}: array {array} has no valid .npy header: {reason}"


# ---- training runs ----

def empty_dataset(source: str) -> str:
    return f"{source}: the dataset is empty (0 samples)"


#: How TorchScript starts an error raised inside a scripted method: its traceback (often thousands of
#: characters of code excerpts) comes first, the error's own line (``RuntimeError: Target 7 is out of
#: bounds.``) last.
TORCHSCRIPT_TRACEBACK = "The following operation failed in the TorchScript interpreter"
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]*\.)?\w*(?:Error|Exception): \S")
#: The longest torch reason a line carries (:func:`torch_reason`); a longer one is cut, with "...".
TORCH_REASON_LIMIT = 300


def one_line(ex: BaseException) -> str:
    """An exception's text on one line: the one rule for shortening torch's and libtorch's messages,
    which span several lines (whitespace collapsed; the exception's type when it says nothing). A
    TorchScript interpreter's traceback is left out: its last ``XxxError: ...`` line is the error (as
    Java's ``ModuleEngine.libtorchSummary`` keeps the last line)."""
    if TORCHSCRIPT_TRACEBACK in str(ex):
        lines = [line for line in str(ex).splitlines() if line.strip()]
        last = ([line for line in lines if _ERROR_LINE.match(line)] or lines)[-1]
        return " ".join(last.split())
    return " ".join(str(ex).split()) or type(ex).__name__


def torch_reason(ex: BaseException) -> str:
    """torch's reason for a failed call, for the end of a line: :func:`one_line`, at most
    TORCH_REASON_LIMIT characters (a longer one cut, with "...")."""
    line = one_line(ex)
    return line if len(line) <= TORCH_REASON_LIMIT else line[:TORCH_REASON_LIMIT] + "..."


def alternatives(items: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return items[-1] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def java_double(value: float) -> str:
    """A float as Java's Double.toString writes it: NaN, Infinity, -Infinity; the shortest digits,
    plain from 1e-3 up to 1e7 (``123.45``, ``1000000.0``) and as ``d.dddE±n`` outside (``3.0E38``)."""
    value = float(value)
    text = repr(value)
    if not math.isfinite(value) or value == 0 or 1e-3 <= abs(value) < 1e7:
        return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(text, text)
    sign, digits, exponent = decimal.Decimal(text).normalize().as_tuple()
    mantissa = "".join(map(str, digits))
    power = exponent + len(mantissa) - 1
    return f"{'-' if sign else ''}{mantissa[0]}.{mantissa[1:] or '0'}E{power}"


def unknown_mode(mode: Any) -> str:
    return f"unknown mode '{mode}'; expected full, step or fused"


def divergence(loss: float, epoch: int, batch: int, first: int, last: int) -> str:
    """A diverged run, before what was kept (Java adds its files, Python ``error.history``)."""
    return (f"loss is {java_double(loss)} at epoch {epoch}, batch {batch} (samples {first}..{last} "
            f"of the epoch's order); training stopped")


# ---- tensors against the metadata ----

def tensor_spec(source: str, name: str, dtype: str, shape: Sequence[int], actual_dtype: str,
                actual_shape: Sequence[int], carrier: Optional[str] = None) -> str:
    """``carrier``: the dtype data carries a 16-bit input as (``protocol.CARRIER``), None for the others."""
    where = f"{source}: " if source else ""
    carried = f" (as {carrier})" if carrier else ""
    return (f"{where}{name} must be {dtype}{carried} of shape {list(shape)} (-1: any number of samples), "
            f"got {actual_dtype} of shape {list(actual_shape)}")


#: Why a TorchScript export with ``autocast=`` traces the model (a script would drop autocast's casts).
AUTOCAST_TRACES = "not tried: autocast= traces the model under torch.autocast"


def autocast_refused(dtype: Any) -> str:
    return (f"autocast must be a dtype torch.autocast(\"cpu\", ...) takes (torch.bfloat16 or torch.float16), "
            f"got {dtype!r}")


def not_exact(source: str, name: str, index: Sequence[int], value: float, dtype: str, carrier: str) -> str:
    """A 16-bit input's ``carrier`` (``protocol.CARRIER``) holding a value its dtype does not (Java: ``Messages.notExact``)."""
    where = f"{source}: " if source else ""
    return (f"{where}{name}{list(index)} = {java_double(value)} is not a {dtype} value; gradbridge casts {carrier} data to "
            f"the model's {dtype} without rounding: round it first (torch.from_numpy(a).to(torch.{dtype}).float())")


# ---- metadata (gradbridge.json) ----

def json_text(value: Any, limit: int = 60) -> str:
    """A JSON value as compact JSON text (Gson's toString prints the same), shortened."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= limit else text[:limit - 3] + "..."


MISSING = "nothing (the key is missing)"


def metadata_key(path: str, key: str, expected: str, actual: str) -> str:
    return f"{path}: gradbridge.json key '{key}' must be {expected}, got {actual}"


def metadata_document(path: str, actual: str) -> str:
    return f"{path}: gradbridge.json must be a JSON object, got {actual}"


def parameter_mismatch(path: str, name: str, declared: str, actual: str) -> str:
    return f"{path}: parameter {name} is {actual} in the module but gradbridge.json declares {declared}"


def unsupported_dtype(kind: str, name: str, dtype: str, supported: Sequence[str]) -> str:
    """A tensor the export cannot carry (``kind``: parameter, buffer, input)."""
    return f"{kind} {name} has dtype {dtype}, which gradbridge does not support; {kind}s may be {', '.join(supported)}"


# ---- arguments ----

INT_MAX = (1 << 31) - 1


def argument(name: str, expected: str, actual: Any) -> str:
    return f"{name} must be {expected}, got {actual!r}"


def check_integer(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in ``low..high``, else InvalidInputError naming the argument.

    A float (``epochs=2.7``) or a bool is refused rather than truncated; numpy integers pass.
    """
    import numbers

    from ..errors import InvalidInputError

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= int(value) <= high:
        raise InvalidInputError(argument(name, f"an integer in {low}..{high}", value))
    return int(value)
