"""Fault suite, surface "a protocol-3 file is data": an edited file that asks for an operator off the allow-list
(aten::from_file, aten::_reshape_alias), sizes a view or a new tensor past the limit, confuses argument kinds,
sets a schedule or optimizer field out of torch's range (StepLR's step_size 0, CosineAnnealingLR's T_max 0,
INT64_MIN epochs, negative or NaN lrs, betas of 1), breaks the limits (a 1 MB op name, 1,000,000-deep JSON,
an entry inflating past 2 GB, a shape whose byte count overflows) or reads what JSON does not say (``4+5``,
``"yes"``, ``"4"``, lrs ``["zzz"]``) is one line from Python's reader and from Java's (each file read and run
in a process of its own: tests/protocol3_worker.py), the same line for both, no abort, no file touched; a
file that holds such an edit trains nowhere. The shared corpus (tests/vectors/protocol3.json) pins the two
readers together; the fuzz test mutates a real module's op lists and program.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from gradbridge._runtime import oplist_check
from tests.faults import one_error_line, stray_files, train_cli

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "vectors" / "protocol3.json"
LIMIT = oplist_check.LIMITS["elements"]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A small real protocol-3 module (Adam, StepLR per step), its data, and a canary file an edit aims at."""
    import torch
    from torch import nn

    from gradbridge import export_training_module

    folder = tmp_path_factory.mktemp("protocol3-data")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    path = export_training_module(model, "cross_entropy", optimizer, folder / "good.pt", example_inputs=(x, y),
                                  format="export", scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=2))
    np.savez(folder / "data.npz", x=x.numpy(), y=y.numpy())
    canary = tmp_path_factory.mktemp("canary") / "canary.bin"
    canary.write_bytes(b"\0" * 64)
    return {"path": path, "data": folder / "data.npz", "canary": canary}


# ---- editing a file ----

def rewrite(source: Path, target: Path, entry: str, change) -> Path:
    """``source`` with zip entry ``entry`` changed: ``change(value)`` edits its parsed JSON in place (or returns
    bytes to write instead)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as new:
        for name in old.namelist():
            data = old.read(name)
            if name == entry:
                document = json.loads(data)
                replaced = change(document)
                data = replaced if isinstance(replaced, bytes) else json.dumps(document).encode()
            new.writestr(name, data)
    return target


def program(change):
    return "gradbridge.json", lambda document: change(document["program"])


def train_graph(change):
    return "graphs/train.json", change


def _append(*nodes):
    """Appends nodes to the train graph; ``{"t": -k}`` in them is the k-th slot from the end once appended
    (-1: the node before), ``"P0"`` the first input (parameter 0.weight, 8 x 4 = 32 elements)."""
    def change(graph):
        slots = len(graph["inputs"]) + sum(max(n["outputs"], 1) for n in graph["nodes"])

        def fix(value):
            if value == "P0":
                return {"t": 0}
            if isinstance(value, dict) and set(value) == {"t"} and isinstance(value["t"], int) and value["t"] < 0:
                return {"t": slots + value["t"]}
            return value
        for node in nodes:
            graph["nodes"].append({"op": node[0], "overload": node[1], "args": [fix(a) for a in node[2]],
                                   "outputs": node[3]})
            slots += max(node[3], 1)
    return change


def _scalar_for_a_tensor(graph):
    """The optimizer graph scales its first parameter by a host scalar's slot (a double) given for the Tensor
    ``mul_.Tensor`` takes: a 16-bit state's factor is a tensor the graph makes of it (``aten::scalar_tensor``)."""
    param = next(i for i, b in enumerate(graph["inputs"]) if b.startswith("param:"))
    scalar = next(i for i, b in enumerate(graph["inputs"]) if b.startswith("scalar:"))
    graph["nodes"].append({"op": "aten::mul_", "overload": "Tensor", "args": [{"t": param}, {"t": scalar}],
                           "outputs": 1})


def _set(path, value):
    def change(document):
        for key in path[:-1]:
            document = document[key]
        document[path[-1]] = value
    return change


def _scheduler(spec):
    return program(lambda p: p["training"].update(scheduler={**p["training"]["scheduler"], **spec}))


def _canary(good):
    return str(good["canary"])


# name -> (entry, change, words both lines hold); a change may take the fixture (``good``) first
HOSTILE = {
    # operators off the allow-list: refused at load, nothing runs
    "from_file_then_fill": (lambda g: train_graph(_append(
        ("aten::from_file", "default", [{"s": _canary(g)}, {"b": True}, {"i": 16}, {"dtype": "float32"}, None, None,
                                         None], 1),
        ("aten::fill_", "Scalar", [{"t": -1}, {"f": "0x1.0p+0"}], 1))),
        "operator aten::from_file.default is not on protocol 3's operator allow-list"),
    "reshape_alias_past_storage": (train_graph(_append(
        ("aten::_reshape_alias", "default", ["P0", {"il": [2 ** 34]}, {"il": [1]}], 1),
        ("aten::sum", "default", [{"t": -1}, None], 1))),
        "operator aten::_reshape_alias.default is not on protocol 3's operator allow-list"),
    "set_storage": (train_graph(_append(("aten::set_", "source_Tensor", ["P0", "P0"], 1))),
                    "operator aten::set_.source_Tensor is not on protocol 3's operator allow-list"),
    "megabyte_op_name": (train_graph(_append(("aten::" + "a" * 1_000_000, "default", [], 1))),  # not echoed whole
                         "op is aten::aaaaaaaaaa"),
    # allowed operators with arguments from the file: checked before they run
    "view_past_the_limit": (train_graph(_append(("aten::view", "default", ["P0", {"il": [2 ** 34]}], 1))),
                            f"size [17179869184] sizes more than the limit of {LIMIT} elements"),
    "expand_past_the_limit": (train_graph(_append(("aten::expand", "default", ["P0", {"il": [2 ** 20, 2 ** 20, 8, 4]},
                                                                                {"b": False}], 1))),
                              f"sizes more than the limit of {LIMIT} elements"),
    "as_strided_past_storage": (train_graph(_append(("aten::as_strided", "default", ["P0", {"il": [2 ** 20]}, {"il": [1]},
                                                                                    None], 1),
                                                    ("aten::sum", "default", [{"t": -1}, None], 1))),
                                "size [1048576], stride [1] and offset 0 reach past its source's"),
    "as_strided_stride_overflows": (train_graph(_append(("aten::as_strided", "default", ["P0", {"il": [3]},
                                                                                        {"il": [2 ** 62]}, {"i": 0}], 1))),
                                    "stride [4611686018427387904] and offset 0 reach past its source's"),
    "zeros_negative": (train_graph(_append(("aten::zeros", "default", [{"il": [-5]}, None, None, None, None], 1))),
                       "holds a negative size"),
    "batch_size_overflows": (train_graph(_append(("aten::view", "default", ["P0", {"sl": [{"bx": [2 ** 62, 2 ** 62]}]}],
                                                  1))), "overflows int64"),
    "item_out_of_range": (train_graph(_append(("aten::unbind", "int", ["P0", {"i": 0}], 1),
                                              ("#item", "", [{"t": -1}, {"i": 99}], 1))), "index 99 of a list of 8"),
    "list_for_a_tensor": (train_graph(_append(("aten::unbind", "int", ["P0", {"i": 0}], 1),
                                              ("aten::relu", "default", [{"t": -1}], 1))),
                          "(a list) where its schema takes Tensor self"),
    "string_for_an_int": (train_graph(_append(("aten::unbind", "int", ["P0", {"s": "x"}], 1))),
                          "an argument of another kind where its schema takes int dim"),
    "double_for_a_tensor": (("graphs/optimizer.json", _scalar_for_a_tensor),
                            "(a double) where its schema takes Tensor other"),
    "slot_not_computed": (train_graph(_append(("aten::relu", "default", [{"t": 10 ** 6}], 1))), "t is 1000000"),
    "train_without_loss": (train_graph(lambda g: g.update(outputs=[o for o in g["outputs"] if o["to"] != "loss"])),
                           "op list train: outputs no loss"),
    # schedule and optimizer fields out of torch's range
    "step_size_0": (_scheduler({"step_size": 0}), "step_size is 0, expected 1 to"),
    "step_size_minus_1_int64_min_epoch": (program(lambda p: (p["training"]["scheduler"].update(step_size=-1),
                                                              p["counters"].update(last_epoch=-2 ** 63))),
                                          "step_size is -1, expected 1 to"),
    "int64_min_epoch": (program(lambda p: p["counters"].update(last_epoch=-2 ** 63)),
                        "last_epoch is -9223372036854775808, expected -1 to"),
    "cosine_t_max_0": (program(lambda p: p["training"].update(scheduler={
        "name": "cosine", "base_lrs": p["training"]["scheduler"]["base_lrs"], "T_max": 0, "eta_min": 0.0})),
        "T_max is 0, expected 1 to"),
    "negative_lr": (program(lambda p: p["counters"].update(lrs=["-0x1.0p-3"])), "lrs[0] is -0x1.0p-3, expected a finite"),
    "nan_lr": (program(lambda p: p["counters"].update(lrs=["nan"])), "lrs[0] is nan, expected a finite double"),
    "zzz_lr": (program(lambda p: p["counters"].update(lrs=["zzz"])), "lrs[0] is zzz, expected a double as float.hex"),
    "beta_1": (program(lambda p: p["training"]["groups"][0].update(betas=[0.9, 1.0])),
               "betas[1] is 1.0, expected a number in [0.0, 1.0)"),
    "negative_eps": (program(lambda p: p["training"]["groups"][0].update(eps=-1e-8)), "eps is -1e-08, expected"),
    "negative_weight_decay": (program(lambda p: p["training"]["groups"][0].update(weight_decay=-1)),
                              "weight_decay is -1, expected"),
    "nan_weight_decay": (program(lambda p: p["training"]["groups"][0].update(weight_decay=float("nan"))),
                         "gradbridge.json: invalid JSON"),
    "huge_accumulate": (program(lambda p: p["training"].update(accumulate=2 ** 62)), "accumulate is 4611686018427387904"),
    "yes_for_a_flag": (program(lambda p: p["training"]["groups"][0].update(amsgrad="yes")),
                       "amsgrad is yes, expected true or false"),
    "string_version": (program(lambda p: p.update(oplist_version="4")), 'op-list version "4"'),
    "four_plus_five": ("graphs/train.json", lambda g: json.dumps(g).replace('"outputs": 1', '"outputs": 4+5', 1).encode(),
                       "op list train: invalid JSON"),
    # limits
    "shape_bytes_overflow": (program(lambda p: p["state"][0].update(shape=[2 ** 30, 2 ** 30])),
                             "holds more than the limit of 2147483639 bytes"),
    "shape_not_numbers": (program(lambda p: p["state"][0].update(shape=["8", 4])), "shape[0] is 8, expected an integer"),
    "deep_op_list": ("graphs/loss.json", lambda g: b"[" * 1_000_000 + b"]" * 1_000_000,
                     "op list loss: invalid JSON (nesting deeper than 32)"),
}


def _hostile_file(good, folder: Path, name: str) -> Path:
    case = HOSTILE[name]
    edit = case[:2] if len(case) == 3 else case[0]
    entry, change = edit(good) if callable(edit) else edit
    return rewrite(good["path"], folder / f"{name}.pt", entry, change)


def _run_worker(data: Path, files) -> list:
    """Each file read and run by both readers in a process of its own: one JSON line per file; an abort fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "python"), str(REPO)]))
    result = subprocess.run([sys.executable, "-m", "tests.protocol3_worker", str(data), *map(str, files)],
                            capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    done = {line["file"] for line in lines}
    missing = [str(f) for f in files if str(f) not in done]
    assert result.returncode == 0 and not missing, (
        f"the worker ended with {result.returncode} (a negative code is a signal) at {missing[:1]}: {result.stderr[-2000:]}")
    return lines


def _watched(folder: Path, canary: Path):
    return sorted(p.name for p in folder.iterdir()), canary.stat().st_mtime_ns, canary.read_bytes()


@pytest.mark.every_torch_java  # both readers on each torch (the CLI runs DJL's libtorch: the oldest only)
def test_every_hostile_edit_is_one_line_from_both_readers_and_touches_nothing(good, tmp_path):
    files = [_hostile_file(good, tmp_path, name) for name in HOSTILE]
    before = _watched(tmp_path, good["canary"])
    lines = _run_worker(good["data"], files)
    assert _watched(tmp_path, good["canary"]) == before
    wrong = []
    for name, line in zip(HOSTILE, lines):
        words = HOSTILE[name][-1]
        for reader in ("python", "java"):
            text = line[reader]
            if not (words in text and str(tmp_path / name) in text and "\n" not in text and len(text) < 1000):
                wrong.append((name, reader, text[:1000]))
    assert not wrong, "\n".join(map(str, wrong))


@pytest.mark.every_torch_java  # both readers on each torch (the CLI runs DJL's libtorch: the oldest only)
def test_the_good_file_trains_in_both_readers(good):
    (line,) = _run_worker(good["data"], [good["path"]])
    assert line == {"file": str(good["path"]), "python": "ok", "java": "ok"}


@pytest.mark.every_torch_java  # both readers on each torch (the CLI runs DJL's libtorch: the oldest only)
def test_an_entry_that_inflates_past_2_gb_is_one_line(good, tmp_path):
    """A state entry of a few MB that inflates past 2 GB (Java's byte arrays end there): read up to its size."""
    target = tmp_path / "bomb.pt"
    with zipfile.ZipFile(good["path"]) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED,
                                                                 compresslevel=1) as new:
        for name in old.namelist():
            if name != "state/0.bin":
                new.writestr(name, old.read(name))
                continue
            with new.open(name, "w", force_zip64=True) as out:
                block = bytes(64 << 20)
                for _ in range(33):  # 2.06 GiB of zeros
                    out.write(block)
    assert target.stat().st_size < 16 << 20
    (line,) = _run_worker(good["data"], [target])
    for reader in ("python", "java"):
        assert "state/0.bin holds" in line[reader] and "needs 128" in line[reader], line


def test_the_command_line_refuses_a_hostile_file_in_one_line(good, tmp_path):
    for name in ("from_file_then_fill", "view_past_the_limit", "step_size_0"):
        bad = _hostile_file(good, tmp_path, name)
        out = tmp_path / name
        out.mkdir()
        line = one_error_line(train_cli("--model", bad, "--data", good["data"], "--epochs", 1, "--batch-size", 4,
                                        "--checkpoint", out / "c.pt", "--history", out / "h.jsonl"))
        assert str(bad) in line and HOSTILE[name][-1] in line, line
        assert stray_files(out) == []


# ---- the shared corpus: both readers classify each file alike ----

def _walk(document, path):
    for key in path[:-1]:
        document = document[key]
    return document, path[-1]


def corpus_file(good, folder: Path, case) -> Path:
    """The corpus case's file: the module with one entry edited as the case says."""
    def change(document):
        if "set" in case:
            parent, key = _walk(document, case["set"][0])
            parent[key] = copy.deepcopy(case["set"][1])
        if "delete" in case:
            parent, key = _walk(document, case["delete"])
            del parent[key]
        text = json.dumps(document).encode()
        if "text" in case:
            old, new = case["text"]
            assert old in text.decode(), (case["name"], old)
            text = text.decode().replace(old, new, 1).encode()
        return text + bytes.fromhex(case.get("raw_tail", ""))
    return rewrite(good["path"], folder / f"{case['name']}.pt", case["entry"], change)


@pytest.mark.every_torch_java  # both readers on each torch (the CLI runs DJL's libtorch: the oldest only)
def test_both_readers_classify_the_shared_corpus_alike(good, tmp_path):
    cases = json.loads(CORPUS.read_text(encoding="utf-8"))["cases"]
    assert len({c["name"] for c in cases}) == len(cases)
    files = [corpus_file(good, tmp_path, case) for case in cases]
    lines = _run_worker(good["data"], files)
    wrong = []
    for case, line in zip(cases, lines):
        for reader in ("python", "java"):
            text = line[reader]
            fine = text == "ok" if case["expect"] == "ok" else (
                case["expect"] in text and str(tmp_path / case["name"]) in text and "\n" not in text)
            if not fine:
                wrong.append((case["name"], reader, text[:600]))
    assert not wrong, "\n".join(map(str, wrong))


# ---- the fuzz test: seeded mutations of a real module's op lists and program ----

INTS = [0, 1, -1, 2, 3, 7, 64, 2 ** 31, 2 ** 34, 2 ** 62, -2 ** 63, 2 ** 63 - 1, 2 ** 63]
VALUES = INTS + [1.5, -0.0, 1e308, "", "x", "nan", "inf", "-0x1p+0", "0x1p+1023", None, True, False, [], {}, [0],
                 {"t": 0}, {"i": -1}, "aten::relu", "#item", "param:0.weight", "scalar:neg_lr:0"]
GRAPHS = ("graphs/train.json", "graphs/optimizer.json", "graphs/forward.json", "graphs/loss.json")


def _positions(document, path=()):
    """Every (container, key) in a JSON tree."""
    items = document.items() if isinstance(document, dict) else enumerate(document) if isinstance(document, list) else ()
    for key, value in items:
        yield document, key
        yield from _positions(value, path + (key,))


def _schema_node(rng, graph):
    """A node of a random operator on the allow-list with arguments of the kinds its schema reads (values drawn
    from the edges: huge, negative, zero sizes; any earlier slot for a tensor), appended to ``graph``."""
    from gradbridge._runtime import oplist

    name = rng.choice(sorted(oplist_check.OPERATORS))
    op, overload = name.rsplit(".", 1)
    try:
        schema = oplist._overload(op, overload)._schema
    except oplist.OpListError:  # on the list for another torch
        return
    try:
        slots = len(graph["inputs"]) + sum(max(n["outputs"], 1) for n in graph["nodes"])
    except (TypeError, KeyError, AttributeError):  # an earlier mutation broke the graph's frame
        return

    def value(type_):
        kind = type_.kind()
        if kind == "OptionalType":
            return None if rng.random() < 0.5 else value(type_.getElementType())
        if kind == "TensorType":
            return {"t": rng.randrange(slots)}
        if kind == "ListType":
            inner = type_.getElementType().kind()
            n = rng.choice([0, 1, 2, 4])
            if inner == "TensorType":
                return {"tl": [rng.randrange(slots) for _ in range(n)]}
            if inner == "OptionalType":
                return {"otl": [rng.randrange(slots) for _ in range(n)]}
            if inner in ("IntType", "SymIntType"):
                return {"il": [rng.choice(INTS[:-1]) for _ in range(n)]}
            if inner == "FloatType":
                return {"fl": ["0x1p+0"] * n}
            return {"bl": [True] * n}
        if kind in ("IntType", "SymIntType"):
            return {"i": rng.choice(INTS[:-1])}
        if kind in ("FloatType", "NumberType"):
            return rng.choice([{"f": rng.choice(["0x1p+0", "-0x1p+1", "nan", "inf", "0x0p+0"])}, {"i": rng.choice(INTS[:-1])}])
        if kind == "BoolType":
            return {"b": rng.random() < 0.5}
        if kind == "StringType":
            return {"s": rng.choice(["none", "tanh", "mean", "x", ""])}
        if kind == "ScalarTypeType":
            return {"dtype": rng.choice(list(oplist_check.DTYPES))}
        if kind == "MemoryFormatType":
            return {"mf": rng.choice(list(oplist_check.MEMORY_FORMATS))}
        if kind == "LayoutType":
            return {"layout": "strided"}
        if kind == "DeviceObjType":
            return {"device": "cpu"}
        return None

    graph["nodes"].append({"op": op, "overload": overload, "args": [value(a.real_type) for a in schema.arguments],
                           "outputs": len(schema.returns)})


def _mutate(rng, entries):
    """One to three mutations of one entry (an op list or gradbridge.json's program): a value replaced by an edge
    value, a key or element dropped or doubled, an operator swapped for another on the list, a node of a random
    operator appended with arguments its schema reads, or the bytes damaged."""
    name = rng.choice(GRAPHS + ("gradbridge.json",))
    data = entries[name]
    if rng.random() < 0.08:
        cut = bytearray(data[: rng.randrange(1, len(data))] if rng.random() < 0.5 else data)
        cut[rng.randrange(len(cut))] = rng.randrange(256)
        return name, bytes(cut)
    document = json.loads(data)
    tree = document["program"] if name == "gradbridge.json" else document
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if name != "gradbridge.json" and roll < 0.35:
            _schema_node(rng, tree)
            continue
        positions = list(_positions(tree))
        parent, key = rng.choice(positions)
        if roll < 0.75:
            parent[key] = copy.deepcopy(rng.choice(VALUES)) if rng.random() < 0.7 else (
                parent[key] + rng.choice([-1, 1]) if oplist_check.is_int(parent[key]) else rng.choice(INTS))
        elif roll < 0.9:
            del parent[key]
        elif isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif isinstance(parent, dict) and key == "op":
            parent["op"], parent["overload"] = rng.choice(sorted(oplist_check.OPERATORS)).rsplit(".", 1)
    return name, json.dumps(document).encode()


@pytest.mark.every_torch_java  # both readers on each torch (the CLI runs DJL's libtorch: the oldest only)
def test_fuzzed_files_are_one_line_or_train_from_both_readers(good, tmp_path, request):
    """Seeded mutations (40 in the default run, 600 with --full): each file is read and run by both readers in
    a process of its own: no abort, nothing touched, one line or success, and both readers agree."""
    import random

    count = 600 if request.config.getoption("--full") else 40
    with zipfile.ZipFile(good["path"]) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    rng = random.Random(47)
    files = []
    for k in range(count):
        name, data = _mutate(rng, entries)
        files.append(_raw(good["path"], tmp_path / f"fuzz{k}.pt", name, data))
    before = _watched(tmp_path, good["canary"])
    lines = []
    for start in range(0, len(files), 200):
        lines += _run_worker(good["data"], files[start:start + 200])
    assert _watched(tmp_path, good["canary"]) == before
    wrong = []
    for line in lines:
        python, java = line["python"], line["java"]
        for text in (python, java):
            if "UNEXPECTED" in text or "\n" in text or len(text) > 2000:
                wrong.append((line["file"], text[:600]))
        if (python == "ok") != (java == "ok"):
            wrong.append((line["file"], f"python: {python[:300]} | java: {java[:300]}"))
    assert not wrong, "\n".join(map(str, wrong))


def _raw(source: Path, target: Path, entry: str, data: bytes) -> Path:
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as new:
        for name in old.namelist():
            new.writestr(name, data if name == entry else old.read(name))
    return target


# ---- the allow-list, and TorchScript files beside it ----

def test_the_allow_list_holds_nothing_that_touches_files_threads_or_global_state():
    """Every operator the capture emits is on the list (each export reads its file back through it, so any
    protocol-3 export in the suite fails on one that is not); none of them reads or writes a file, sets a
    storage, seeds or reaches past its arguments (as_strided's and as_strided_scatter's extents are checked
    against their source's storage before they run; the in-place as_strided_ stays off)."""
    forbidden = ("from_file", "save", "load", "_fused", "set_", "storage", "resize", "print", "_assert", "seed",
                 "set_num_threads", "record_stream", "_local_scalar", "_reshape_alias", "unsafe_chunk",
                 "_unsafe_index")  # no bounds check on indices an edited graph computes
    operators = json.loads((REPO / "python" / "gradbridge" / "_runtime" / "oplist_rules.json").read_text())["operators"]
    assert operators == sorted(set(operators)) and all(op.startswith("aten::") for op in operators)
    assert [op for op in operators if any(word in op.split("::")[1] for word in forbidden)] == []
    assert "aten::as_strided_.default" not in operators  # the in-place form restrides its argument


def test_an_edited_torchscript_metadata_schedule_is_one_line_in_python_and_not_run_by_java(jvm, tmp_path):
    """A TorchScript module runs the schedule compiled into its code; its metadata describes it for Python's
    reference, which checks it as the export did (StepLR's step_size 0 would divide by zero in torch)."""
    import torch
    from torch import nn

    from gradbridge import ProtocolError, export_training_module, reference
    from gradbridge.export import finetune
    from gradbridge.jvm import load_module, to_tensor
    from tests.faults import rewrite_metadata

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "ts.pt", example_inputs=(x, y),
                                  format="torchscript", scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 2))

    def zero(document):
        document[finetune.METADATA_KEY]["scheduler"]["step_size"] = 0
        return document
    bad = rewrite_metadata(path, tmp_path / "bad.pt", zero)
    with pytest.raises(ProtocolError) as info:
        reference.Reference(bad)
    assert str(bad) in str(info.value) and "step_size must be positive, got 0" in str(info.value), info.value
    module = load_module(bad)
    try:
        lrs = []
        for _ in range(3):
            module.trainStep(to_tensor(x.numpy()), to_tensor(y.numpy()))
            lrs.append(float(module.getLr()))
        assert lrs == pytest.approx([0.1, 0.01, 0.01])  # the compiled StepLR(step_size=2), not the edited one
    finally:
        module.close()


def test_an_export_whose_capture_emits_an_operator_off_the_list_is_refused(tmp_path, monkeypatch):
    """The test that fails when the capture emits an operator the list lacks: every export reads its file back
    through the allow-list (here relu's taken off it)."""
    import torch
    from torch import nn

    from gradbridge import export_training_module
    from gradbridge.errors import ExportError

    monkeypatch.setattr(oplist_check, "OPERATORS", oplist_check.OPERATORS - {"aten::relu.default"})
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.raises(ExportError) as info:
        export_training_module(model, "cross_entropy", {"name": "sgd", "lr": 0.1}, tmp_path / "m.pt",
                               example_inputs=(torch.randn(4, 4), torch.randint(0, 3, (4,))), format="export")
    assert "operator aten::relu.default is not on protocol 3's operator allow-list" in str(info.value), info.value
    assert not (tmp_path / "m.pt").exists()
