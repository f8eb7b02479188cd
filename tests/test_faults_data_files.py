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


# ---- issue 47: an array the model does not take; an id or label outside what the model takes ----

def test_an_array_the_model_does_not_take_is_refused_by_both_languages(models, tmp_path):
    """Was dropped without a word, while gradbridge-spark refuses such a Parquet column: now the same rule's
    line (InputMessages.unknownArray), before anything is written."""
    path = tmp_path / "extra.npz"
    np.savez(path, x=X, weights=X, y=Y)
    expected = messages.unknown_array(str(path), "weights", ["x"])
    assert expected == (f"{path}: array weights is not an input of the model (it takes [x] and y); an .npz holds "
                        "exactly the model's inputs and y: drop the others")
    with pytest.raises(InvalidInputError) as info:
        data.load_npz(path)
    assert str(info.value) == expected
    for option in ("--data", "--val"):
        args = ["--data", tmp_path / "good.npz"] if option == "--val" else []
        np.savez(tmp_path / "good.npz", x=X, y=Y)
        result = train_cli("--model", models["linear_regression.pt"], *args, option, path, "--epochs", 1,
                           "--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt")
        assert one_error_line(result) == expected, option
        assert stray_files(tmp_path, keep=[path.name, "good.npz"]) == []


@pytest.fixture(scope="module")
def recommender(tmp_path_factory):
    """A model of embedding ids: x = [user, item] (5 users, 4 items), a float rating y."""
    from gradbridge.recommender import export

    return export(tmp_path_factory.mktemp("recommender") / "recommender.pt", users=5, items=4, dim=2, lr=0.05)


def _labels(bad):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 4)).astype(np.float32)
    y = rng.integers(0, 3, 40).astype(np.int64)
    y[17] = bad
    return {"x": x, "y": y}


def _ids(bad):
    rng = np.random.default_rng(4)
    ids = np.stack([rng.integers(0, 5, 40), rng.integers(0, 4, 40)], 1).astype(np.int64)
    ids[29, 1] = bad
    return {"x": ids, "y": rng.standard_normal((40, 1)).astype(np.float32)}


# (model, arrays, the array, where in a row, the value, the range the model takes there)
OUT_OF_RANGE = {
    "label_past_the_classes": ("mlp_classifier.pt", _labels(7), "y", None, 7, 0, 2),
    "negative_label": ("mlp_classifier.pt", _labels(-1), "y", None, -1, 0, 2),
    "id_past_the_embedding": ("recommender", _ids(9), "x", [1], 9, 0, 3),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_an_id_or_label_the_model_does_not_take_names_the_data_file_and_the_array(models, recommender, tmp_path,
                                                                                  case):
    """libtorch's "Target 7 is out of bounds" / "index out of range in self" named the module file: the line
    now names the data file, the array, the value and the range the model takes, the same from gradbridge-train
    (for --data and --val) and from the eager reference; nothing is written."""
    from gradbridge import reference

    name, arrays, array, element, value, low, high = OUT_OF_RANGE[case]
    model = recommender if name == "recommender" else models[name]
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    expected = messages.value_out_of_range(str(path), array, element, value, low, high)
    result = train_cli("--model", model, "--data", path, "--epochs", 1, "--batch-size", 8,
                       "--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt")
    assert one_error_line(result) == expected
    assert str(model) not in result.stderr
    assert stray_files(tmp_path, keep=[path.name]) == []
    with pytest.raises(InvalidInputError) as info:
        reference.train(model, arrays["x"], arrays["y"], epochs=1, batch_size=8, source=str(path))
    assert str(info.value) == expected
    # the same data as validation data, after an epoch on good data
    good = tmp_path / "good.npz"
    fixed = dict(arrays)
    fixed[array] = np.clip(arrays[array], 0, None) % (high + 1)
    np.savez(good, **fixed)
    result = train_cli("--model", model, "--data", good, "--val", path, "--epochs", 1, "--batch-size", 8,
                       "--history", tmp_path / "h.jsonl")
    assert one_error_line(result) == expected
    assert stray_files(tmp_path, keep=[path.name, good.name]) == []


def test_the_search_for_a_value_out_of_range():
    """data.out_of_range (Java: ValueRanges, the same steps) on a stand-in model that takes ids [0, 5) and
    [0, 4) in the two elements of x and labels in [0, 3) or -100: the first array and element at fault, its
    range searched from 0; no line when the model refuses zeros, or a value only beside another's extreme."""
    limits = np.array([5, 4])

    def refuses(batch):
        ids, y = batch["x"], batch["y"]
        return bool((ids < 0).any() or (ids >= limits).any() or ((y < 0) & (y != -100)).any() or (y >= 3).any())

    y = np.array([0, 2, 1, -100])
    ids = np.array([[0, 1], [4, 3], [2, 0], [1, 2]])
    assert data.out_of_range(refuses, "d.npz", {"x": ids, "y": y}) is None
    bad = ids.copy()
    bad[2] = [6, 9]  # the largest values first, bisected to the first element that is refused alone
    assert data.out_of_range(refuses, "d.npz", {"x": bad, "y": y}) == messages.value_out_of_range(
        "d.npz", "x", [0], 6, 0, 4)
    bad[2] = [2, -3]
    assert data.out_of_range(refuses, "d.npz", {"x": bad, "y": y}) == messages.value_out_of_range(
        "d.npz", "x", [1], -3, 0, 3)
    assert data.out_of_range(refuses, "d.npz", {"x": ids, "y": np.array([0, 1, 2**40])}) == \
        messages.value_out_of_range("d.npz", "y", None, 2**40, 0, 2)
    assert data.out_of_range(lambda batch: True, "d.npz", {"x": bad, "y": y}) is None
    together = lambda batch: bool((batch["x"].sum(axis=1) > 6).any())  # noqa: E731: each alone is taken
    assert data.out_of_range(together, "d.npz", {"x": ids, "y": y}) is None
