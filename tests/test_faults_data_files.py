"""Fault suite, surface "data files": .npz/.npy that must be refused the same way by both languages.

Java's first reader ignored numpy's byte order and Fortran flag and trusted the header's shape, so
these files trained on garbage (big-endian) or died with an ArithmeticException trace (a header
claiming 10^12 rows). Python and gradbridge's own Java reader now print the same line.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from gradbridge import InvalidInputError, messages
from gradbridge._runtime import data
from tests.faults import one_error_line, stray_files, train_cli

X = (np.arange(40, dtype=np.float32).reshape(40, 1) / 40)
Y = 2 * X + 1


def _npy_with_header(header: dict, payload: bytes) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + payload


def _npz(path, members: dict):
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(f"{name}.npy", content)
    return path


def _npy_bytes(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


HUGE = {"descr": "<f4", "fortran_order": False, "shape": (10**12, 1)}

CASES = {
    "big_endian": (lambda: {"x": _npy_bytes(X.astype(">f4")), "y": _npy_bytes(Y)},
                   lambda src: messages.big_endian(src, "x", ">f4")),
    # A column-major [40, 2] array: a reader ignoring the flag reads it row-major, i.e. scrambled.
    "fortran": (lambda: {"x": _npy_bytes(np.asfortranarray(X.repeat(2, 1))), "y": _npy_bytes(Y)},
                lambda src: messages.fortran_order(src, "x")),
    "huge_header": (lambda: {"x": _npy_with_header(HUGE, X.tobytes()), "y": _npy_bytes(Y)},
                    lambda src: messages.npy_size(src, "x", [10**12, 1], "<f4", 4 * 10**12, 160)),
    "truncated": (lambda: {"x": _npy_bytes(X)[:-8], "y": _npy_bytes(Y)},
                  lambda src: messages.npy_size(src, "x", [40, 1], "<f4", 160, 152)),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-data")
    return {name: _npz(folder / f"{name}.npz", make()) for name, (make, _) in CASES.items()}


def test_fortran_fixture_is_fortran_ordered(files):
    with zipfile.ZipFile(files["fortran"]) as archive, archive.open("x.npy") as fp:
        np.lib.format.read_magic(fp)
        assert np.lib.format.read_array_header_1_0(fp)[1] is True


@pytest.mark.parametrize("name", sorted(CASES))
def test_python_refuses_with_the_shared_line(files, name):
    with pytest.raises(InvalidInputError) as info:
        data.load_npz(files[name])
    assert str(info.value) == CASES[name][1](str(files[name]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_java_cli_refuses_with_the_same_line(models, files, tmp_path, name):
    result = train_cli("--model", models["linear_regression.pt"], "--data", files[name], "--epochs", 1,
                       "--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt")
    assert one_error_line(result) == CASES[name][1](str(files[name]))
    assert stray_files(tmp_path) == []


def test_java_npy_pair_refuses_big_endian(models, tmp_path):
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, X.astype(">f4"))
    np.save(y, Y)
    result = train_cli("--model", models["linear_regression.pt"], "--x", x, "--y", y)
    assert one_error_line(result) == messages.big_endian(str(x), "x", ">f4")


def test_huge_header_npy_pair(models, tmp_path):
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    x.write_bytes(_npy_with_header(HUGE, X.tobytes()))
    np.save(y, Y)
    result = train_cli("--model", models["linear_regression.pt"], "--x", x, "--y", y)
    assert one_error_line(result) == messages.npy_size(str(x), "x", [10**12, 1], "<f4", 4 * 10**12, 160)


def test_wrong_dtype_same_line_in_both_languages(models, tmp_path):
    """A float64 x: Python's data.check and Java's Dataset word the refusal the same way."""
    path = tmp_path / "float64.npz"
    np.savez(path, x=X.astype(np.float64), y=Y)
    expected = messages.tensor_spec(str(path), "x", "float32", [-1, 1], "float64", [40, 1])
    metadata = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 1]},
                           {"name": "y", "dtype": "float32", "shape": [-1, 1]}]}
    with pytest.raises(InvalidInputError) as info:
        data.load_checked(metadata, path)
    assert str(info.value) == expected
    result = train_cli("--model", models["linear_regression.pt"], "--data", path, "--epochs", 1,
                       "--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt")
    assert one_error_line(result) == expected
    assert stray_files(tmp_path, keep=[path.name]) == []


def test_little_endian_still_trains(models, tmp_path):
    good = tmp_path / "good.npz"
    np.savez(good, x=X.astype("<f4"), y=Y)
    data.load_npz(good)
    result = train_cli("--model", models["linear_regression.pt"], "--data", good, "--batch-size", 8)
    assert result.returncode == 0, result.stderr


def test_an_array_inflating_past_two_gigabytes_is_one_line(models, tmp_path):
    """A few MB of compressed zeros that inflate to 2.2 GB: one line naming the array and the limit, no trace."""
    rows = (2**31 + 2**27) // 4
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as out:
            np.lib.format.write_array_header_1_0(out, {"descr": "<f4", "fortran_order": False, "shape": (rows, 1)})
            zeros = bytes(1 << 24)
            left = rows * 4
            while left:
                out.write(zeros[:min(left, len(zeros))])
                left -= min(left, len(zeros))
        archive.writestr("y.npy", _npy_bytes(np.zeros((1, 1), np.float32)))
    assert path.stat().st_size < 20 * 2**20
    result = train_cli("--model", models["linear_regression.pt"], "--data", path, "--epochs", 1,
                       "--history", tmp_path / "h.jsonl")
    line = one_error_line(result)
    assert line.startswith(f"{path}: x of shape [{rows}, 1] holds {rows * 4} bytes, beyond the "), line
    assert stray_files(tmp_path, keep=("huge.npz",)) == []
