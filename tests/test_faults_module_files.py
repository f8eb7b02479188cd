"""Fault suite, surface "module files": whatever is passed as the module, both CLIs and the Python
API answer with one line (or the documented exception) naming the file; the seed example too. Protocol-3
files (format="export") too: an unknown operator, op-list version or argument kind, a missing graph, state
file, state entry or counter, a state tensor of another shape, dtype or size, a truncated or damaged zip.
"""

from __future__ import annotations

import json
import struct
import zipfile

import numpy as np
import pytest

from gradbridge import ModuleLoadError, ProtocolError
from gradbridge._runtime import oplist
from gradbridge._runtime.devtree import root
from gradbridge.jvm import load_module

REPO_ROOT = root()
from tests.faults import gradbridge_cli, one_error_line, stray_files, train_cli

SEED_SCRIPT = REPO_ROOT / "build" / "install" / "gradbridge" / "bin" / "gradbridge"


@pytest.fixture(scope="module")
def files(models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-modules")
    good = models["linear_regression.pt"].read_bytes()
    truncated = folder / "truncated.pt"
    truncated.write_bytes(good[: len(good) // 2])
    empty = folder / "empty.pt"
    empty.write_bytes(b"")
    directory = folder / "folder.pt"
    directory.mkdir()
    data = folder / "data.npz"
    x = np.linspace(0, 1, 10, dtype=np.float32).reshape(10, 1)
    np.savez(data, x=x, y=x)
    return {"missing": folder / "absent.pt", "truncated": truncated, "empty": empty, "folder": directory,
            "text": models["not_torchscript.pt"], "no_protocol": models["no_protocol.pt"],
            "missing_methods": models["missing_methods.pt"], "data": data}


# name -> (Python exception of jvm.load_module, words the line must hold)
CASES = {
    "missing": (ModuleLoadError, "(file not found)"),
    "folder": (ModuleLoadError, "(file not found)"),
    "truncated": (ModuleLoadError, "is not a TorchScript file (not a zip archive)"),
    "empty": (ModuleLoadError, "is not a TorchScript file (not a zip archive)"),
    "text": (ModuleLoadError, "is not a TorchScript file (not a zip archive)"),
    "no_protocol": (ProtocolError, "is a TorchScript module without gradbridge.json"),
    "missing_methods": (ProtocolError, "lacks protocol methods"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_train_cli(files, tmp_path, name):
    line = one_error_line(train_cli("--model", files[name], "--data", files["data"], "--history", tmp_path / "h.jsonl",
                                    "--checkpoint", tmp_path / "c.pt"))
    assert str(files[name]) in line and CASES[name][1] in line, line
    assert stray_files(tmp_path) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_in_process(jvm, files, name):
    error, words = CASES[name]
    with pytest.raises(error) as info:
        load_module(files[name])
    assert str(files[name]) in str(info.value) and words in str(info.value)


@pytest.mark.parametrize("name", ["missing", "truncated", "text", "no_protocol"])
def test_parity_cli(files, name):
    line = one_error_line(gradbridge_cli("parity", files[name], "--data", files["data"], "--epochs", 1),
                          prefix="gradbridge: error: ")
    assert line.startswith(f"{files[name]}: ") or str(files[name]) in line, line


@pytest.mark.parametrize("args", [["--model", "MISSING"], ["--model", "GOOD", "--lr", "abc"],
                                  ["--model", "GOOD", "--epochs", "0"]])
def test_seed_example(files, models, args):
    args = [str(files["missing"]) if a == "MISSING" else str(models["linear_regression.pt"]) if a == "GOOD" else a
            for a in args]
    import subprocess

    line = one_error_line(subprocess.run([str(SEED_SCRIPT), *args], capture_output=True, text=True))
    assert line, line


# ---- protocol 3 (format="export"): every bad file is one line naming it, from Java, the CLI and Python ----

def _graph_edit(graph_name, change):
    def edit(name, data, metadata):
        if name != f"graphs/{graph_name}.json":
            return data
        graph = json.loads(data)
        change(graph)
        return json.dumps(graph).encode()
    return edit


def _program_edit(change):
    """An edit of gradbridge.json's program entry (``change(program, metadata)``)."""
    def edit(name, data, metadata):
        if name != "gradbridge.json":
            return data
        document = json.loads(data)
        change(document["program"], document)
        return json.dumps(document).encode()
    return edit


def _entry(program, name):
    return next(e for e in program["state"] if e["name"] == name)


def _set(node_field, value):
    def change(graph):
        node = graph["nodes"][0]
        if node_field == "args":
            node["args"][0] = value
        else:
            node[node_field] = value
    return change


def _shape(name, shape=None, dtype=None):
    def change(program, _):
        entry = _entry(program, name)
        entry["shape"] = shape if shape is not None else entry["shape"]
        entry["dtype"] = dtype or entry["dtype"]
    return change


def _drop_entry(name):
    def change(program, _):
        program["state"] = [e for e in program["state"] if e["name"] != name]
    return change


def _short_file(file):
    return lambda name, data, metadata: data[: len(data) // 2] if name == file else data


# name -> (edit of each zip entry: (name, bytes, metadata) -> bytes or None to drop it; words of the line)
PROGRAM_CASES = {
    "unknown_op": (_graph_edit("train", _set("op", "aten::no_such_op")),
                   "op list train node 0: operator aten::no_such_op."),
    "oplist_version": (_graph_edit("train", lambda g: g.update(oplist_version=99)),
                       f"op list train: op-list version 99, this gradbridge runs version {oplist.VERSION}"),
    "argument_kind": (_graph_edit("optimizer", _set("args", {"q": 1})), "unknown argument kind 'q'"),
    "older_program": (_program_edit(lambda program, _: program.update(oplist_version=oplist.VERSION - 1)),
                      f"op-list version {oplist.VERSION - 1}, this gradbridge runs version {oplist.VERSION}; export the model again"),
    "missing_graph": (lambda name, data, m: None if name == "graphs/train.json" else data,
                      "the protocol-3 module lacks graphs/train.json"),
    "missing_state_file": (lambda name, data, m: None if name == "state/0.bin" else data,
                           "the protocol-3 module lacks state/0.bin"),
    "missing_state_entry": (_program_edit(_drop_entry("state:exp_avg:0.weight")),
                            "op list optimizer reads state tensor state:exp_avg:0.weight, which the file lacks"),
    "missing_counters": (_program_edit(lambda program, _: program.pop("counters")),
                         "the protocol-3 module lacks program.counters"),
    "parameter_shape": (_program_edit(_shape("param:0.weight", shape=[4, 8])),
                        "state tensor param:0.weight is float32 [4, 8], expected float32 [8, 4]"),
    "parameter_dtype": (_program_edit(_shape("param:0.weight", dtype="float64")),
                        "state tensor param:0.weight is float64 [8, 4], expected float32 [8, 4]"),
    "optimizer_state_shape": (_program_edit(_shape("state:exp_avg_sq:2.bias", shape=[8])),
                              "state tensor state:exp_avg_sq:2.bias is float32 [8], expected float32 [3]"),
    "unknown_dtype": (_program_edit(_shape("state:step:2.bias", dtype="complex64")),
                      "state tensor state:step:2.bias is complex64 [], expected float32 []"),
    "short_state_file": (_short_file("state/0.bin"),
                         "state/0.bin holds 64 bytes, param:0.weight (float32 [8, 4]) needs 128"),
    # both readers read JSON strictly, nesting bounded (oplist_rules.json's limits)
    "graph_not_json": (lambda name, data, m: data[:-2] if name == "graphs/loss.json" else data,
                       "op list loss: invalid JSON"),
    "graph_too_deep": (lambda name, data, m: b"[" * 100000 + b"]" * 100000 if name == "graphs/loss.json" else data,
                       "op list loss: invalid JSON (nesting deeper than 32)"),
}
# zip damage: Java names it "not a TorchScript file (not a zip archive)" (Metadata.read sees no zip), Python
# "not a TorchScript archive (not a zip file)"; a damaged entry (its CRC-32 fails) is one line from each reader
DAMAGE = {"truncated": ("is not a TorchScript file (not a zip archive)", "not a TorchScript archive (not a zip file)"),
          "damaged_entry": ("not a readable protocol-3 module", "not a readable protocol-3 module")}


@pytest.fixture(scope="module")
def program_files(tmp_path_factory):
    import torch
    from torch import nn

    from gradbridge import export_training_module

    folder = tmp_path_factory.mktemp("bad-programs")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(8, 4)
    y = torch.randint(0, 3, (8,))
    good = export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters()), folder / "good.pt",
                                  example_inputs=(x, y), format="export")
    files = {"good": good}
    for name, (edit, _) in PROGRAM_CASES.items():
        files[name] = folder / f"{name}.pt"
        with zipfile.ZipFile(good) as old, zipfile.ZipFile(files[name], "w", zipfile.ZIP_DEFLATED) as new:
            for entry in old.namelist():
                data = edit(entry, old.read(entry), None)
                if data is not None:
                    new.writestr(entry, data)
    raw = good.read_bytes()
    files["truncated"] = folder / "truncated.pt"
    files["truncated"].write_bytes(raw[: len(raw) // 2])
    files["damaged_entry"] = folder / "damaged_entry.pt"
    with zipfile.ZipFile(good) as old, zipfile.ZipFile(files["damaged_entry"], "w", zipfile.ZIP_STORED) as new:
        for entry in old.namelist():
            new.writestr(entry, old.read(entry))
    with zipfile.ZipFile(files["damaged_entry"]) as archive:
        info = archive.getinfo("state/0.bin")
    stored = bytearray(files["damaged_entry"].read_bytes())
    name_length, extra_length = struct.unpack("<HH", stored[info.header_offset + 26:info.header_offset + 30])
    stored[info.header_offset + 30 + name_length + extra_length] ^= 0xFF  # the entry's first byte: its CRC-32 fails
    files["damaged_entry"].write_bytes(bytes(stored))
    np.savez(folder / "data.npz", x=torch.randn(16, 4).numpy(), y=torch.randint(0, 3, (16,)).numpy())
    files["data"] = folder / "data.npz"
    return files


def _program_words(name, java):
    words = DAMAGE[name] if name in DAMAGE else PROGRAM_CASES[name][1]
    return words[0 if java else 1] if isinstance(words, tuple) else words


BAD_PROGRAMS = sorted(PROGRAM_CASES) + sorted(DAMAGE)


@pytest.mark.parametrize("name", BAD_PROGRAMS)
def test_protocol_3_in_process(jvm, program_files, name):
    with pytest.raises((ModuleLoadError, ProtocolError)) as info:
        load_module(program_files[name])
    line = str(info.value)
    assert str(program_files[name]) in line and _program_words(name, True) in line and "\n" not in line, line


@pytest.mark.parametrize("name", BAD_PROGRAMS)
def test_protocol_3_train_cli(program_files, tmp_path, name):
    result = train_cli("--model", program_files[name], "--data", program_files["data"], "--history", tmp_path / "h.jsonl",
                       "--checkpoint", tmp_path / "c.pt")
    line = one_error_line(result)
    assert str(program_files[name]) in line and _program_words(name, True) in line, line
    assert stray_files(tmp_path) == []


@pytest.mark.parametrize("name", BAD_PROGRAMS)
def test_protocol_3_python_loaders(program_files, name):
    from gradbridge import reference

    with pytest.raises(ProtocolError) as info:
        reference.initial_state(program_files[name])
    line = str(info.value)
    assert str(program_files[name]) in line and _program_words(name, False) in line and "\n" not in line, line


def test_the_good_protocol_3_file_loads_everywhere(jvm, program_files, tmp_path):
    from gradbridge import reference

    load_module(program_files["good"]).close()
    assert sorted(reference.initial_state(program_files["good"])) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    result = train_cli("--model", program_files["good"], "--data", program_files["data"], "--batch-size", 8)
    assert result.returncode == 0, result.stderr
