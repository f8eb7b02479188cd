"""``format="auto"``, the default of ``export_training_module`` and ``gradbridge export --format``: TorchScript
where it captures the model and passes the export's check, protocol 3 (torch.export) otherwise, said in a
warning and in the metadata; one line with both reasons when neither can. A torch whose ``torch.jit.script``
raises still exports what protocol 3 captures. ``gradbridge doctor`` names the formats this torch exports."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gradbridge import export_training_module, java, messages, protocol, reference
from gradbridge._runtime import oplist
from gradbridge.commands import doctor
from gradbridge.errors import ExportError, TorchScriptUnavailableError
from tests.data import labelled
from tests.models import zoo
from tests.models.custom import LayerDropNet, QuantizedNet

ROOT = Path(__file__).resolve().parents[1]
N, BATCH = 16, 4


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.15), nn.Linear(8, 3))


def _export(tmp_path, name="m.pt", **options):
    x, y = labelled(N, tensors=True, labels="random")
    return export_training_module(_mlp(), "cross_entropy", {"name": "adam", "lr": 0.01}, tmp_path / name,
                                  example_inputs=(x[:BATCH], y[:BATCH]), **options)


@pytest.fixture
def torch_without_torchscript(monkeypatch):
    """This torch as a release that removed TorchScript would be: torch.jit.script raises."""
    def removed(*args, **kwargs):
        raise RuntimeError("torch.jit.script was removed in this release")

    monkeypatch.setattr(torch.jit, "script", removed)


def test_auto_is_the_default_and_takes_torchscript_where_it_captures_the_model(tmp_path):
    default = protocol.read_metadata(_export(tmp_path))
    explicit = protocol.read_metadata(_export(tmp_path, "ts.pt", format="torchscript"))
    assert default["protocol_version"] == protocol.PROTOCOL_VERSION
    assert default["capture"] == {"kind": "script", "checked": True, "draws_random": True}
    assert default == explicit


def test_auto_takes_protocol_3_for_a_model_torchscript_cannot_capture_and_says_why(tmp_path, caplog):
    torch.manual_seed(0)
    x, y = zoo._tokens(BATCH, 0)
    with caplog.at_level(logging.WARNING):
        path = export_training_module(zoo.gpt2(), "cross_entropy", "adamw", tmp_path / "gpt2.pt", example_inputs=(x, y))
    metadata = protocol.read_metadata(path)
    assert metadata["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION
    why = metadata["capture"][protocol.AUTO_REASON_KEY]
    assert why.startswith("cannot script or trace TokenClassifier: ") and "\n" not in why
    assert metadata["capture"]["kind"] == "export" and metadata["capture"]["checked"]
    assert messages.auto_took_export(why) in caplog.messages


def test_when_neither_format_can_one_line_gives_both_reasons(tmp_path):
    x, y = labelled(N, tensors=True, labels="random")
    with pytest.raises(ExportError) as info:
        export_training_module(LayerDropNet(), "cross_entropy", "adam", tmp_path / "m.pt", example_inputs=(x, y))
    line = str(info.value)
    torchscript, _, export = line.partition("; and protocol 3 (format='export') cannot either: ")
    assert torchscript.startswith("export check failed: train_step 1: your eager model draws random numbers as ")
    assert export.startswith("torch.export cannot capture LayerDropNet's training step: the model's Python code "
                             "depends on the values in its tensors")
    assert "tests/models/custom.py:54 `if self.training and torch.rand([]) < 0.0:`" in export
    assert "\n" not in line and list(tmp_path.iterdir()) == []


def test_a_custom_autograd_function_is_refused_by_both_formats_in_one_line(tmp_path):
    """Non-strict torch.export keeps a custom Function's forward and drops its backward: refused, not differentiated
    wrongly."""
    x, y = labelled(N, tensors=True, labels="random")
    with pytest.raises(ExportError) as info:
        export_training_module(QuantizedNet(), "cross_entropy", "adam", tmp_path / "m.pt", example_inputs=(x, y))
    torchscript, _, export = str(info.value).partition("; and protocol 3 (format='export') cannot either: ")
    assert torchscript.startswith("cannot script or trace QuantizedNet: ")
    assert export == messages.aten_option_refused(
        "custom autograd.Function _RoundStraightThrough (torch.export keeps its forward, not its backward)")
    assert "\n" not in str(info.value) and list(tmp_path.iterdir()) == []


def test_a_model_whose_loss_reaches_no_parameter_is_refused_by_protocol_3_in_one_line(tmp_path):
    class Detached(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(6, 3)

        def forward(self, x):
            return self.layer(x).detach() + x[:, :3]

    x, _ = labelled(N, tensors=True, labels="random")
    with pytest.raises(ExportError) as info:
        export_training_module(Detached(), "mse", "adam", tmp_path / "p3.pt", example_inputs=(x, torch.ones(N, 3)),
                               format="export")
    assert str(info.value) == messages.aten_no_gradient("Detached")
    assert list(tmp_path.iterdir()) == []


def test_a_torch_whose_jit_script_raises_exports_with_protocol_3_and_java_trains_it(jvm, torch_without_torchscript,
                                                                                     tmp_path):
    with pytest.raises(TorchScriptUnavailableError) as info:
        _export(tmp_path, "ts.pt", format="torchscript")
    assert "refuses torch.jit.script" in str(info.value) and "\n" not in str(info.value)
    path = _export(tmp_path)
    metadata = protocol.read_metadata(path)
    assert metadata["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION
    assert "refuses torch.jit.script" in metadata["capture"][protocol.AUTO_REASON_KEY]
    x, y = labelled(N, tensors=True, labels="random")
    vx, vy = labelled(N, seed=1, tensors=True, labels="random")
    settings = dict(epochs=2, batch_size=BATCH, val=(vx.numpy(), vy.numpy()))
    eager = reference.train(path, x.numpy(), y.numpy(), model=_mlp(), mode="step", **settings)
    trained = java.train(path, x.numpy(), y.numpy(), mode="fused", **settings)
    assert [(r.loss, r.val_loss, r.digests) for r in trained] == [(r.loss, r.val_loss, r.digests) for r in eager]


def _gradbridge(*args):
    return subprocess.run([sys.executable, "-m", "gradbridge", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT)


def test_the_command_line_takes_format_and_says_which_it_wrote(tmp_path):
    model = ["tests.models.custom:two_layer_regressor", "--input-shape", "3", "--optimizer", "adam"]
    for format, said in (("auto", "TorchScript, scripted"), ("export", "protocol 3, torch.export")):
        out = tmp_path / f"{format}.pt"
        result = _gradbridge("export", *model, "-o", out, "--format", format)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().splitlines()[-1] == f"wrote {out} ({said})"
    assert protocol.read_metadata(tmp_path / "export.pt")["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION


def _rows():
    lines = []
    doctor.run(lines.append)
    return {line[:22].strip(): line[22:].strip() for line in lines if not line.startswith(("problem", "no problems"))}


def test_doctor_names_the_formats_this_torch_exports():
    assert _rows()["export formats"] == (
        f"torchscript (protocol 2), export (protocol 3, torch.export, op-list version {oplist.VERSION}); "
        "format='auto' takes TorchScript where it captures the model, else protocol 3")


def test_doctor_on_a_torch_without_torchscript_names_protocol_3_alone(torch_without_torchscript):
    assert _rows()["export formats"] == (
        f"export (protocol 3, torch.export, op-list version {oplist.VERSION}); not torchscript (see TorchScript); "
        "format='auto' takes export")
