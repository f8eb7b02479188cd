"""Training data on the Python side: .npz files and the checks Java's Dataset makes.

The messages match ``dev.gradbridge.data.Dataset`` so a user sees the same words from either
language.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, Dict, Sequence, Tuple

import numpy as np

from . import inputs
from .. import messages
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
    per input named as the module names them (``inputs.names``): ``x`` is then a dict of arrays."""
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
        if str(array.dtype) != spec["dtype"] or not shape_ok:
            raise InvalidInputError(messages.tensor_spec(source, name, spec["dtype"], spec["shape"], str(array.dtype),
                                                         array.shape))
        if np.issubdtype(array.dtype, np.floating) and array.size and not np.isfinite(array).all():
            raise InvalidInputError(f"{source}: {name} holds NaN or infinite values; clean the data first")
    first = inputs.names(metadata)[0]
    n = len(given[first])
    if n == 0:
        raise InvalidInputError(messages.empty_dataset(source))
    for name in [*inputs.names(metadata)[1:], inputs.Y]:
        if len(given[name]) != n:
            raise InvalidInputError(f"{source}: {first} has {n} samples but {name} has {len(given[name])}")
