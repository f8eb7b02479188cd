"""Fault suite, export: real optimizer instances export unless they have really stepped, and a
built-in exported with input shapes it cannot take is refused before anything is written.
"""

from __future__ import annotations

import pytest
import torch

from gradbridge import GradbridgeError, export_training_module, protocol, reference
from gradbridge.models import mlp

INPUTS = [protocol.tensor_spec("x", [-1, 4], "float32"), protocol.tensor_spec("y", [-1], "int64")]


def _model():
    torch.manual_seed(0)
    return mlp(4, (8,), 3)


def test_fresh_adagrad_instance_exports_and_trains_like_torch(tmp_path):
    model = _model()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05, initial_accumulator_value=0.1)
    assert optimizer.state, "Adagrad creates its state when constructed"
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "adagrad.pt", inputs=INPUTS)
    spec = protocol.read_metadata(path)["optimizer"]
    assert spec["name"] == "adagrad" and spec["lr"] == 0.05 and spec["initial_accumulator_value"] == 0.1

    module = torch.jit.load(str(path))
    eager = reference.Reference(path, model)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    with torch.jit.optimized_execution(False):
        for _ in range(5):
            assert torch.equal(module.train_step(x, y), eager.train_step(x, y))
        assert all(torch.equal(a, b) for a, b in zip(module.get_parameters(), eager.parameters().values()))


@pytest.mark.parametrize("make", [
    lambda params: torch.optim.Adagrad(params),
    lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    lambda params: torch.optim.Adam(params),
])
def test_stepped_optimizer_is_refused(tmp_path, make):
    model = _model()
    optimizer = make(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    with pytest.raises(GradbridgeError, match=r"has already stepped; export a fresh optimizer"):
        export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", inputs=INPUTS)
    assert not (tmp_path / "m.pt").exists()


def test_builtin_with_an_impossible_input_shape_is_refused_at_export(tmp_path):
    from gradbridge import export_builtin

    with pytest.raises(ValueError, match=r"^inputs x \[-1, 5\] float32, y \[-1\] int64 do not fit model mlp with "
                                         r"loss cross_entropy: .*5.*4"):
        export_builtin("mlp", tmp_path / "m.pt", in_features=4, hidden=(8,), out_features=3, loss={"name": "cross_entropy"},
                       inputs=[protocol.tensor_spec("x", [-1, 5], "float32"), protocol.tensor_spec("y", [-1], "int64")])
    assert list(tmp_path.iterdir()) == []


def test_export_cli_with_an_impossible_input_shape(tmp_path):
    from tests.faults import gradbridge_cli, one_error_line

    result = gradbridge_cli("export", "mlp", "-o", tmp_path / "m.pt", "--input-shape", "3,3", "--loss", "cross_entropy")
    line = one_error_line(result, "gradbridge: error: ")
    assert line.startswith("inputs x [-1, 3, 3] float32, y [-1] int64 do not fit model mlp with loss cross_entropy: ")
    assert list(tmp_path.iterdir()) == []


def test_files_follow_the_umask_and_keep_existing_permissions(tmp_path):
    import os
    import stat

    from gradbridge import History, export_builtin
    from gradbridge.history import EpochRecord

    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    previous = os.umask(0o027)
    try:
        model = export_builtin("linear-regression", tmp_path / "lr.pt")
        history = History([EpochRecord(0, 1.0, {})]).save(tmp_path / "h.jsonl")
        assert (mode(model), mode(history)) == (0o640, 0o640)
        os.chmod(history, 0o644)
        os.umask(0o077)
        History([EpochRecord(0, 2.0, {})]).save(history)
        assert mode(history) == 0o644
    finally:
        os.umask(previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl", "lr.pt"]
