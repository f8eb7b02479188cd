"""Training data on the Python side: .npz files and the checks Java's Dataset makes.

The messages match ``dev.gradbridge.data.Dataset`` so a user sees the same words from either
language.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import inputs
from .. import messages, protocol
from ..errors import InvalidInputError


def check_npy_header(fp, total_bytes: int, source: str, array: str) -> None:
    """The .npy header of one array against the bytes that follow it, before numpy reads the data:
    the same checks and messages as Java's ``NpyHeader`` (byte order, C order, a shape that fits
    the data), so both languages refuse the same files with the same line."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fp)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read(fp, max_header_size=1 << 20)
    except ValueError as ex:
        raise InvalidInputError(messages.npy_header(source, array, str(ex).splitlines()[0])) from ex
    descr = dtype.str
    if descr.startswith(">") and dtype.itemsize > 1:
        raise InvalidInputError(messages.big_endian(source, array, descr))
    if fortran:
        raise InvalidInputError(messages.fortran_order(source, array))
    claimed = dtype.itemsize * int(np.prod(shape, dtype=object))
    available = total_bytes - fp.tell()
    if dtype.itemsize and claimed != available:
        raise InvalidInputError(messages.npy_size(source, array, shape, descr, claimed, available))


def _check_npz_headers(path: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.filename.endswith(".npy"):
                with archive.open(info) as fp:
                    check_npy_header(fp, info.file_size, str(path), info.filename[:-4])


def load_npz(path: str | os.PathLike, input_names: Sequence[str] = (inputs.X,)) -> Tuple[Any, np.ndarray]:
    """The inputs and ``y`` from an .npz written with ``numpy.savez(path, x=..., y=...)``, or one array
    per input named as the module names them (``inputs.names``): ``x`` is then a dict of arrays. An
    array missing, or one that is neither an input nor y, is refused (Java's ``Dataset.check``)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"{path}: no such data file")
    needs = [*input_names, inputs.Y]
    try:
        _check_npz_headers(path)
        with np.load(path, allow_pickle=False) as arrays:
            names = list(arrays.keys())
            for name in needs:
                if name not in names:
                    raise InvalidInputError(messages.input_missing(str(path), name, names, needs))
            # what was saved for training: an array left out would be dropped unseen (.npy entries, as Java reads)
            for name in [entry[:-4] for entry in arrays.zip.namelist() if entry.endswith(".npy")]:
                if name not in needs:
                    raise InvalidInputError(messages.unknown_array(str(path), name, list(input_names)))
            if inputs.is_single(input_names):
                return arrays[inputs.X], arrays[inputs.Y]
            return {name: arrays[name] for name in input_names}, arrays[inputs.Y]
    except (zipfile.BadZipFile, ValueError, OSError) as ex:
        raise InvalidInputError(f"{path}: not a readable .npz file: {ex}") from ex


def load_checked(metadata: Dict[str, Any], path: str | os.PathLike) -> Tuple[Any, np.ndarray]:
    """``load_npz`` of the module's inputs then ``check`` against its metadata, naming the file."""
    x, y = load_npz(path, inputs.names(metadata))
    check(metadata, x, y, str(path))
    return x, y


def check(metadata: Dict[str, Any], x: Any, y: np.ndarray, source: str) -> None:
    """Dtypes and shapes (all but the batch dimension) against the metadata, equal sample
    counts, at least one sample, only finite values. ``x``: an array, or a dict of arrays by input."""
    specs = {spec["name"]: spec for spec in metadata["inputs"]}
    given = {**inputs.arrays(x), inputs.Y: y}
    for name in [*inputs.names(metadata), inputs.Y]:
        if name not in given:
            raise InvalidInputError(messages.input_missing(source, name, list(given), list(specs)))
        array = np.asarray(given[name])
        spec = specs[name]
        shape_ok = array.ndim == len(spec["shape"]) and list(array.shape[1:]) == spec["shape"][1:]
        if not carries(spec["dtype"], str(array.dtype)) or not shape_ok:
            carrier = protocol.CARRIER if spec["dtype"] in protocol.LOW_PRECISION else None
            raise InvalidInputError(messages.tensor_spec(source, name, spec["dtype"], spec["shape"], str(array.dtype),
                                                         array.shape, carrier))
        if np.issubdtype(array.dtype, np.floating) and array.size and not np.isfinite(array).all():
            raise InvalidInputError(f"{source}: {name} holds NaN or infinite values; clean the data first")
        _check_exact(source, name, array, spec["dtype"])
    first = inputs.names(metadata)[0]
    n = len(given[first])
    if n == 0:
        raise InvalidInputError(messages.empty_dataset(source))
    for name in [*inputs.names(metadata)[1:], inputs.Y]:
        if len(given[name]) != n:
            raise InvalidInputError(f"{source}: {first} has {n} samples but {name} has {len(given[name])}")


def carries(dtype: str, array_dtype: str) -> bool:
    """Whether an array of ``array_dtype`` holds an input of ``dtype``: its own, or for a 16-bit float
    ``protocol.CARRIER`` (the rule: ``protocol.CARRIER``'s comment)."""
    return array_dtype == dtype or (dtype in protocol.LOW_PRECISION and array_dtype == protocol.CARRIER)


def _check_exact(source: str, name: str, array: np.ndarray, dtype: str) -> None:
    """A 16-bit input's carrier holds only values of the dtype (the cast would round none); Java's
    ``Dataset.checkExact`` and ``HostTensor`` refuse the same element with the same line."""
    if dtype not in protocol.LOW_PRECISION or str(array.dtype) != protocol.CARRIER or not array.size:
        return
    flat = np.ascontiguousarray(array).reshape(-1)
    if dtype == "bfloat16":  # a bfloat16 value is a float32 whose low 16 bits are zero
        inexact = (flat.view(np.uint32) & 0xFFFF) != 0
    else:
        with np.errstate(over="ignore"):
            inexact = flat.astype(np.float16).astype(np.float32) != flat
    if inexact.any():
        at = int(np.argmax(inexact))
        index = [int(i) for i in np.unravel_index(at, array.shape)]
        raise InvalidInputError(messages.not_exact(source, name, index, float(flat[at]), dtype, protocol.CARRIER))


def tensors(metadata: Dict[str, Any], x: Any, y: Any, source: str) -> Tuple[Any, Any]:
    """The inputs (an array, or a dict by name) and y as tensors in the metadata's dtypes: a 16-bit
    input's carrier cast to its dtype, its values checked first (``_check_exact``, naming ``source``);
    the others as they are, sharing memory."""
    import torch

    dtypes = {spec["name"]: spec["dtype"] for spec in metadata["inputs"]}

    def cast(name: str, value: Any) -> Any:
        tensor = inputs.to_torch(value)
        wanted = dtypes.get(name)
        if wanted in protocol.LOW_PRECISION and protocol.dtype_name(tensor.dtype) == protocol.CARRIER:
            _check_exact(source, name, tensor.detach().cpu().numpy(), wanted)
            return tensor.to(getattr(torch, wanted))
        return tensor

    if isinstance(x, Mapping):
        return {name: cast(name, value) for name, value in x.items()}, cast(inputs.Y, y)
    return cast(inputs.names(metadata)[0], x), cast(inputs.Y, y)


#: Rows of every probe ``out_of_range`` evaluates (Java: ValueRanges.Probe.ROWS): two, not one, so that a
#: batch dimension of 1 is never what a model refuses.
PROBE_ROWS = 2
#: The farthest a range is searched from 0 on the side away from the value at fault (Java: ValueRanges.FAR).
FAR = 1 << 62


def out_of_range(refuses: Callable[[Dict[str, np.ndarray]], bool], source: str,
                 arrays: Mapping[str, Any]) -> Optional[str]:
    """The line naming an array of ``arrays`` (the module's inputs in its order, then y) that holds an id or
    label the model does not take, or None (none found, or the model refuses rows of zeros too).

    ``refuses(batch)``: whether the model's loss in eval mode fails on ``batch`` (each array by name, two
    rows). libtorch's error ("Target 7 is out of bounds", "index out of range in self") names neither the
    data nor the array; this asks the model instead, as Java's ``ValueRanges.check`` does, step for step:
    rows of zeros first (the inputs' float values too); then, array by array (int64 only), rows holding each
    element's largest value over the data, then its smallest; the first refused is narrowed to one element
    by bisection, and the range the model takes there is searched from 0 (binary search towards the value,
    doubling then binary search on the other side). A value the model takes alone but not beside the other
    elements' extremes (no row need hold them together) gives no line.
    """
    columns = []
    for name, array in arrays.items():
        array = np.asarray(array)
        extremes = None
        if array.dtype == np.int64 and len(array):
            rows = array.reshape(len(array), -1)
            extremes = (rows.max(axis=0).tolist(), rows.min(axis=0).tolist())
        columns.append((name, array.dtype, array.shape[1:], extremes))
    probe = _RangeProbe(refuses, columns)
    if probe.fails(-1, None):
        return None
    for c, (name, _, row_shape, extremes) in enumerate(columns):
        if extremes is None:
            continue
        for extreme in extremes:
            if not probe.fails(c, extreme):
                continue
            e = probe.narrow(c, extreme)
            value = extreme[e]
            element = None if len(extreme) == 1 else [int(i) for i in np.unravel_index(e, row_shape)]
            length = len(extreme)
            if not probe.fails(c, _at(length, e, value)):  # refused only beside other elements' extremes: no line
                continue
            low = probe.edge(c, length, e, value if value < 0 else probe.far(c, length, e, -1))
            high = probe.edge(c, length, e, value if value > 0 else probe.far(c, length, e, 1))
            return messages.value_out_of_range(source, name, element, value, low, high)
    return None


def _at(length: int, e: int, value: int) -> List[int]:
    """A row of ``length`` zeros but ``value`` at element ``e``."""
    row = [0] * length
    row[e] = value
    return row


class _RangeProbe:
    """``out_of_range``'s questions to the model, each a batch of zeros but for one array's rows:
    ``columns`` holds each array's (name, dtype, row shape, extremes)."""

    def __init__(self, refuses: Callable[[Dict[str, np.ndarray]], bool], columns: List[tuple]):
        self.refuses = refuses
        self.columns = columns

    def fails(self, c: int, row: Optional[Sequence[int]]) -> bool:
        """Whether the model refuses rows of zeros whose array ``c`` holds ``row`` (c = -1: zeros only)."""
        batch = {}
        for i, (name, dtype, row_shape, _) in enumerate(self.columns):
            values = np.zeros((PROBE_ROWS, *row_shape), dtype)
            if i == c:
                values[:] = np.asarray(row, np.int64).reshape(row_shape)
            batch[name] = values
        return self.refuses(batch)

    def narrow(self, c: int, extreme: List[int]) -> int:
        """The element of a refused row ``extreme`` of array ``c`` that it is refused for, by bisection."""
        candidates = [e for e, value in enumerate(extreme) if value != 0]
        while len(candidates) > 1:
            half = candidates[:len(candidates) // 2]
            chosen = set(half)
            only = [extreme[e] if e in chosen else 0 for e in range(len(extreme))]
            candidates = half if self.fails(c, only) else candidates[len(candidates) // 2:]
        return candidates[0]

    def far(self, c: int, length: int, e: int, direction: int) -> int:
        """A refused value of element ``e`` in ``direction``, doubling from 1 (``FAR`` when none is)."""
        for bit in range(62):
            if self.fails(c, _at(length, e, direction * (1 << bit))):
                return direction * (1 << bit)
        return direction * FAR

    def edge(self, c: int, length: int, e: int, refused: int) -> int:
        """The last value of element ``e`` the model takes on the way from 0 to ``refused`` (binary search);
        ``refused`` itself when the model takes it."""
        if not self.fails(c, _at(length, e, refused)):
            return refused
        ok, bad = 0, refused
        while abs(bad - ok) > 1:
            mid = ok + _toward_zero_half(bad - ok)
            if self.fails(c, _at(length, e, mid)):
                bad = mid
            else:
                ok = mid
        return ok


def _toward_zero_half(d: int) -> int:
    """``d / 2`` rounded toward zero, as Java's long division (the probes' sequence is Java's)."""
    return -((-d) // 2) if d < 0 else d // 2
