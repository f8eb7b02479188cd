"""Protocol 3 (``export_training_module(..., format="export")``): the training step captured with torch.export
as gradbridge's op lists and run op by op by the native layer. An MLP with dropout and the zoo's BERT with
its attention mask, trained from Java (in this process and in a JVM of its own) bit for bit like the user's
eager nn.Module and torch.optim, with validation; what protocol 3 does not hold yet refused in one line, and
every bad protocol-3 file refused in one line naming what is wrong."""

from __future__ import annotations

import json
import re
import zipfile

import numpy as np
import pytest
import torch
from torch import nn

from gradbridge import export_training_module, java, launcher, oplist, protocol, reference
from gradbridge.errors import ExportError, GradbridgeError
from gradbridge.jvm import load_module
from tests.models import zoo

pytestmark = pytest.mark.every_torch_java

N, BATCH = 24, 8


def _same(a, b):
    assert [(r.loss, r.val_loss) for r in a] == [(r.loss, r.val_loss) for r in b]
    assert [r.digests for r in a] == [r.digests for r in b]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))


def _mlp_data(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, 4, generator=g), torch.randint(0, 3, (N,), generator=g)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    model = _mlp()
    x, y = _mlp_data(0)
    path = tmp_path_factory.mktemp("p3") / "mlp.pt"
    export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.1),
                           path, example_inputs=(x[:BATCH], y[:BATCH]), format="export")
    return model, path


def test_the_file_is_a_zip_of_metadata_op_lists_and_state(mlp):
    _, path = mlp
    metadata = protocol.read_metadata(path)
    assert metadata["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION == 3
    assert tuple(metadata)[:len(protocol.METADATA_KEYS)] == protocol.METADATA_KEYS
    assert metadata["capture"] == {"kind": "export", "checked": True}
    program = metadata[protocol.PROGRAM_KEY]
    assert set(program["graphs"]) == {"train", "forward", "loss", "optimizer"}
    with zipfile.ZipFile(path) as archive:
        train = json.loads(archive.read(program["graphs"]["train"]))
        assert {e["file"] for e in program["state"]} <= set(archive.namelist())
    assert train["oplist_version"] == oplist.VERSION
    ops = [node["op"] for node in train["nodes"]]
    # eager's CPU dropout (a bernoulli mask, divided by 1 - p, multiplied in), not torch's traced native_dropout
    assert "aten::bernoulli" in ops and "aten::native_dropout" not in ops
    assert {o["to"] for o in train["outputs"]} == {"loss"} | {f"grad:{n}" for n, _ in _mlp().named_parameters()}


@pytest.mark.parametrize("mode", ["step", "fused", "full"])
def test_java_trains_an_mlp_with_dropout_like_the_users_model(jvm, mlp, mode):
    model, path = mlp
    x, y = _mlp_data(0)
    vx, vy = _mlp_data(1)
    settings = dict(epochs=2, batch_size=BATCH, mode=mode, val=(vx.numpy(), vy.numpy()))
    _same(java.train(path, x.numpy(), y.numpy(), **settings),
          reference.train(path, x.numpy(), y.numpy(), model=model, **settings))


def test_java_trains_bert_with_an_attention_mask_in_process_and_in_a_jvm_of_its_own(jvm, tmp_path):
    torch.manual_seed(0)
    model = zoo.bert()
    x, y = zoo._tokens(16, 0)
    vx, vy = zoo._tokens(6, 1)
    path = export_training_module(model, "cross_entropy", torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  tmp_path / "bert.pt", example_inputs=({n: t[:BATCH] for n, t in x.items()}, y[:BATCH]),
                                  format="export")
    arrays = {n: t.numpy() for n, t in x.items()}
    val = ({n: t.numpy() for n, t in vx.items()}, vy.numpy())
    settings = dict(epochs=2, batch_size=BATCH, mode="step")
    eager = reference.train(path, arrays, y.numpy(), model=model, val=val, **settings)
    _same(java.train(path, arrays, y.numpy(), val=val, **settings), eager)
    np.savez(tmp_path / "train.npz", **arrays, y=y.numpy())
    np.savez(tmp_path / "val.npz", **val[0], y=val[1])
    own_jvm = lambda: launcher.train(path, tmp_path / "train.npz", val=tmp_path / "val.npz",  # noqa: E731
                                     history=tmp_path / "h.jsonl", **settings)
    try:
        history = own_jvm()
    except GradbridgeError as ex:  # a checkout's own JVM runs the jar's libtorch: another release is refused
        line = str(ex)
        engine = re.search(r"this JVM runs libtorch (\S+):", line)
        assert engine and _release(engine.group(1)) != _release(torch.__version__), line
        assert "a protocol-3 module (format='export') runs on the torch release it was captured with" in line
        assert "\n" not in line
    else:
        _same(history, eager)


def _release(version):
    return ".".join(version.split("+")[0].split(".")[:2])


@pytest.mark.parametrize("options, line", [
    (dict(scheduler={"name": "cosine", "T_max": 3}), "format='export' does not support scheduler yet"),
    (dict(accumulate=2), "format='export' does not support accumulate yet"),
    (dict(freeze=["0."]), "format='export' does not support freeze yet"),
    (dict(optimizer="rmsprop"), "format='export' does not support optimizer rmsprop yet (it exports sgd, adam, adamw)"),
    (dict(batch=1), "format='export' needs an example batch of at least 2 samples, got 1"),
])
def test_what_protocol_3_does_not_hold_is_refused_in_one_line(tmp_path, options, line):
    x, y = _mlp_data(0)
    batch = options.pop("batch", BATCH)
    optimizer = options.pop("optimizer", "sgd")
    with pytest.raises(ExportError) as info:
        export_training_module(_mlp(), "cross_entropy", optimizer, tmp_path / "m.pt",
                               example_inputs=(x[:batch], y[:batch]), format="export", **options)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)
    assert not (tmp_path / "m.pt").exists()


def _rewrite(source, target, edit):
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for name in old.namelist():
            data = edit(name, old.read(name))
            if data is not None:
                new.writestr(name, data)
    return target


def _edit_train(change):
    def edit(name, data):
        if name != "graphs/train.json":
            return data
        graph = json.loads(data)
        change(graph)
        return json.dumps(graph)
    return edit


def _unknown_op(graph):
    graph["nodes"][0]["op"] = "aten::no_such_op"


def _version(graph):
    graph["oplist_version"] = 99


def _kind(graph):
    graph["nodes"][0]["args"][0] = {"q": 1}


@pytest.mark.parametrize("edit, words", [
    (_edit_train(_unknown_op), "op list train: unknown operator aten::no_such_op."),
    (_edit_train(_version), "op list train: op-list version 99, this gradbridge runs version 1"),
    (_edit_train(_kind), "unknown argument kind 'q'"),
    (lambda name, data: None if name == "state/0.bin" else data, "the protocol-3 module lacks state/0.bin"),
])
def test_a_bad_protocol_3_file_is_refused_in_one_line(jvm, mlp, tmp_path, edit, words):
    _, path = mlp
    bad = _rewrite(path, tmp_path / "bad.pt", edit)
    with pytest.raises(Exception) as info:
        load_module(bad)
    message = str(info.value.getMessage()) if hasattr(info.value, "getMessage") else str(info.value)
    assert words in message and "\n" not in message


def test_checkpoints_are_refused_in_one_line(jvm, mlp, tmp_path):
    _, path = mlp
    module = load_module(path)
    try:
        with pytest.raises(Exception) as info:
            module.snapshot()
        assert "protocol-3 modules (format='export') do not support snapshots yet" in str(info.value.getMessage())
    finally:
        module.close()


def test_python_tools_that_read_torchscript_refuse_a_protocol_3_module_in_one_line(mlp):
    from gradbridge import torchscript
    from gradbridge.errors import ProtocolError

    _, path = mlp
    with pytest.raises(ProtocolError) as info:
        torchscript.load(str(path))
    assert "a protocol-3 module (format='export') is not TorchScript" in str(info.value)
    with pytest.raises(ProtocolError, match="a protocol-3 module .* holds no Python model: pass model="):
        reference.Reference(path)
