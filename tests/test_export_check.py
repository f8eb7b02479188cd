"""Exported means eager: a module the exporter writes trains like the user's own nn.Module, or the export
is refused with one line (``export.capture`` and ``export.self_check``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gradbridge import export_training_module, protocol, reference
from gradbridge.errors import ExportError
from gradbridge._runtime.torchscript import load
from tests.data import labelled
from gradbridge.export import self_check
from tests.models.custom import (CumulativeNormNet, IgnoredCallNet, KeywordNet, LayerDropNet, RowIndexNet,
                                  TrainingRowIndexNet)
from tests.models.eval_cache import EvalCacheNet

ROOT = Path(__file__).resolve().parents[1]
ADAM = {"name": "adam", "lr": 0.01}


def _capture(path):
    return protocol.read_metadata(path)[protocol.CAPTURE_KEY]


@pytest.mark.every_torch_java
def test_a_traced_model_trains_and_validates_from_java_like_the_users_model(jvm, tmp_path):
    """Dropout and BatchNorm in a model TorchScript cannot script: the training step traced in training
    mode, evaluate in eval mode; Java equals the user's eager model and torch.optim bit for bit."""
    from gradbridge import java

    torch.manual_seed(0)
    model = KeywordNet()
    x, y = labelled(48, tensors=True)
    path = export_training_module(model, "cross_entropy", ADAM, tmp_path / "m.pt", example_inputs=(x[:8], y[:8]))
    assert _capture(path) == {"kind": "trace", "checked": True, "draws_random": True}
    vx, vy = labelled(16, seed=1, tensors=True)
    arrays = dict(x=x.numpy(), y=y.numpy(), val=(vx.numpy(), vy.numpy()), epochs=2, batch_size=8)
    for mode in ("step", "fused"):
        java_history = java.train(path, mode=mode, **arrays)
        eager_history = reference.train(path, mode=mode, model=model, **arrays)
        for mine, theirs in zip(java_history, eager_history):
            assert mine.loss == theirs.loss and mine.val_loss == theirs.val_loss, mode
            assert mine.digests == theirs.digests, mode
    # evaluate is eval mode: no dropout, so two calls agree, and equal eager model.eval()
    module = load(str(path))
    module.eval()
    first, second = module.evaluate(vx, vy), module.evaluate(vx, vy)
    model.eval()
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model(vx), vy)
    assert torch.equal(first, second) and torch.equal(first, expected)


def test_tracing_leaves_the_models_buffers_and_the_generator_as_they_were(tmp_path):
    torch.manual_seed(0)
    model = KeywordNet()
    model.norm.running_mean.add_(0.5)  # a "pretrained" statistic the export must keep
    before = {name: b.clone() for name, b in model.named_buffers()}
    generator = torch.get_rng_state()
    path = export_training_module(model, "cross_entropy", ADAM, tmp_path / "m.pt",
                                  example_inputs=labelled(8, tensors=True))
    assert torch.equal(torch.get_rng_state(), generator)
    exported = reference.initial_state(path)
    for name, value in before.items():
        assert torch.equal(exported[name], value), name
        assert torch.equal(dict(model.named_buffers())[name], value), name


def test_a_random_draw_the_trace_drops_is_refused_in_one_line(tmp_path):
    with pytest.raises(ExportError) as info:
        export_training_module(LayerDropNet(), "cross_entropy", ADAM, tmp_path / "m.pt",
                               example_inputs=labelled(8, tensors=True))
    message = str(info.value)
    assert message.startswith("export check failed: train_step 1: your eager model draws random numbers as "
                              "rand x1, bernoulli_ x1, the export as bernoulli_ x1")
    assert "\n" not in message and "check=False" in message
    assert list(tmp_path.iterdir()) == []
    # the documented way out writes it, and says it was not checked
    path = export_training_module(LayerDropNet(), "cross_entropy", ADAM, tmp_path / "m.pt",
                                  example_inputs=labelled(8, tensors=True),
                                  check=False)
    assert _capture(path) == {"kind": "trace", "checked": False, "draws_random": True}


def test_a_value_the_trace_froze_is_caught_at_the_second_step(tmp_path):
    with pytest.raises(ExportError, match=r"^export check failed: train_step 2: buffer norm\.running_mean differs "
                                          r"from your eager model at element \d+: eager .*, exported .*; the trace "
                                          r"does not reproduce the model"):
        export_training_module(CumulativeNormNet(), "cross_entropy", ADAM, tmp_path / "m.pt",
                               example_inputs=labelled(8, tensors=True))
    assert list(tmp_path.iterdir()) == []


def test_a_trace_that_froze_the_batch_size_is_refused_in_one_line(tmp_path):
    """A trace holding the example's batch size could not take an online micro-batch or a Spark partition of
    another: the check runs it on all the example's rows but one (issue 46: HF GPT-2 on token ids alone)."""
    with pytest.raises(ExportError) as info:
        export_training_module(RowIndexNet(), "cross_entropy", ADAM, tmp_path / "m.pt", format="torchscript",
                               example_inputs=labelled(8, tensors=True))
    message = str(info.value)
    assert message.startswith("export check failed: evaluate (eval mode) on 7 of the example's 8 rows raised: ")
    assert "the trace holds the example's batch size (8)" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []  # format="auto" (the default) takes protocol 3 instead


@pytest.mark.parametrize("lean", [False, True])
def test_a_trace_that_froze_the_batch_size_in_training_mode_alone_is_refused(tmp_path, monkeypatch, lean):
    """The smaller batch runs the training trace's forward too (Java trains micro-batches of any size), in the
    full check and in a large model's lean one (``self_check.LEAN_CHECK_BYTES``, lowered here to take this model)."""
    if lean:
        monkeypatch.setattr(self_check, "LEAN_CHECK_BYTES", 0)
    with pytest.raises(ExportError) as info:
        export_training_module(TrainingRowIndexNet(), "cross_entropy", ADAM, tmp_path / "m.pt", format="torchscript",
                               example_inputs=labelled(8, tensors=True))
    message = str(info.value)
    assert message.startswith("export check failed: the training loss on 7 of the example's 8 rows raised: "), message
    assert "the trace holds the example's batch size (8)" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_a_large_models_lean_check_runs_one_step_and_still_catches_an_eval_cache(tmp_path, monkeypatch):
    """A model of LEAN_CHECK_BYTES or more (lowered here) gets one training step per side, not STEPS, and keeps
    eval mode before and after it: an eval-time cache that Python's train() clears is still refused."""
    steps = []
    original = self_check._step
    monkeypatch.setattr(self_check, "_step", lambda side, method, *rest: (steps.append(method), original(side, method, *rest))[1])
    export_training_module(KeywordNet(), "cross_entropy", ADAM, tmp_path / "full.pt", format="torchscript",
                           example_inputs=labelled(8, tensors=True))
    assert steps == ["train_step 1", "train_step 2"] * 2
    monkeypatch.setattr(self_check, "LEAN_CHECK_BYTES", 0)
    steps.clear()
    export_training_module(KeywordNet(), "cross_entropy", ADAM, tmp_path / "lean.pt", format="torchscript",
                           example_inputs=labelled(8, tensors=True))
    assert steps == ["train_step 1"] * 2
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    model = EvalCacheNet()
    with pytest.raises(ExportError, match=r"^export check failed: evaluate \(eval mode\) after train_step 1: loss differs"):
        export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters(), lr=0.1), tmp_path / "m.pt",
                               example_inputs=(x, y), format="torchscript")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.pt", "lean.pt"]


@pytest.mark.parametrize("how", ["script", "trace"])
def test_a_module_already_scripted_or_traced_is_refused(tmp_path, how):
    net = torch.nn.Sequential(torch.nn.Linear(6, 3))
    captured = torch.jit.script(net) if how == "script" else torch.jit.trace(net, (labelled(4, tensors=True)[0],))
    kind = "scripted" if how == "script" else "traced"
    with pytest.raises(ExportError, match=rf"^the model is already a TorchScript module \({kind}\); pass the "
                                          r"nn.Module itself"):
        export_training_module(captured, "cross_entropy", "sgd", tmp_path / "m.pt",
                               example_inputs=labelled(4, tensors=True))
    assert list(tmp_path.iterdir()) == []


def test_a_model_that_scripts_but_cannot_be_saved_is_traced(tmp_path):
    inputs = [protocol.tensor_spec("x", [-1, 6], "float32"), protocol.tensor_spec("y", [-1], "int64")]
    with pytest.raises(ExportError, match=r"^cannot script IgnoredCallNet: .*; pass example_inputs=\(x, y\) to "
                                          r"trace it instead$"):
        export_training_module(IgnoredCallNet(), "cross_entropy", "sgd", tmp_path / "m.pt", inputs=inputs)
    path = export_training_module(IgnoredCallNet(), "cross_entropy", "sgd", tmp_path / "m.pt",
                                  example_inputs=labelled(8, tensors=True))
    assert _capture(path) == {"kind": "trace", "checked": True, "draws_random": False}


def test_a_scripted_model_with_dropout_predicts_in_eval_mode(tmp_path):
    """forward is the eval-mode prediction for a scripted model too (Java's forward and predict)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3))
    x, y = labelled(8, tensors=True)
    path = export_training_module(model, "cross_entropy", ADAM, tmp_path / "m.pt", example_inputs=(x, y))
    assert _capture(path) == {"kind": "script", "checked": True, "draws_random": True}
    module = load(str(path))
    module.eval()
    with torch.no_grad():
        assert torch.equal(module.forward(x), model.eval()(x))


def test_the_command_line_checks_and_skips_with_no_check(tmp_path):
    def export(*extra):
        return subprocess.run([sys.executable, "-m", "gradbridge", "export", "tests.models.custom:layer_drop", "-o",
                               tmp_path / "m.pt", "--input-shape", "6", "--loss", "cross_entropy", *extra],
                              capture_output=True, text=True, cwd=ROOT)

    refused = export()
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1].startswith("gradbridge: error: export check failed: train_step 1:")
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "m.pt").exists()
    written = export("--no-check")
    assert written.returncode == 0, written.stderr
    assert _capture(tmp_path / "m.pt") == {"kind": "trace", "checked": False, "draws_random": True}
    assert np.isfinite(reference.initial_state(tmp_path / "m.pt")["head.weight"].numpy()).all()


def test_parity_compares_with_the_users_model_and_says_which_reference_it_used(tmp_path):
    """An export that skipped the check (a trace that dropped a random draw): against the stored model
    parity is bitwise and says it is not the user's model; against the user's model it differs."""
    def gradbridge(*args):
        return subprocess.run([sys.executable, "-m", "gradbridge", *map(str, args)], capture_output=True, text=True,
                              cwd=ROOT)

    model = tmp_path / "m.pt"
    assert gradbridge("export", "tests.models.custom:layer_drop", "-o", model, "--input-shape", "6", "--loss",
                      "cross_entropy", "--no-check").returncode == 0
    x, y = labelled(32, tensors=True)
    np.savez(tmp_path / "train.npz", x=x.numpy(), y=y.numpy())
    common = ("parity", model, "--data", tmp_path / "train.npz", "--epochs", 2, "--batch-size", 8)
    stored = gradbridge(*common)
    assert stored.returncode == 0, stored.stdout + stored.stderr
    assert ("reference: the model stored in the .pt (TorchScript, trace) and torch.optim, not your nn.Module (the "
            "export was NOT checked against your nn.Module); pass --model-factory MODULE:FACTORY") in stored.stdout
    users = gradbridge(*common, "--model-factory", "tests.models.custom:layer_drop", "--report", tmp_path / "r.json")
    assert users.returncode == 1, users.stdout + users.stderr
    assert "reference: your eager nn.Module (tests.models.custom:layer_drop) and torch.optim" in users.stdout
    assert "bitwise identical" not in users.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["config"]["reference"].startswith("your eager nn.Module")
    assert not report["comparisons"][0]["bitwise"]


def test_a_model_returning_a_model_output_is_refused_with_what_to_do(tmp_path):
    class Outputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(6, 3)

        def forward(self, x):
            return {"logits": self.linear(x)}

    with pytest.raises(ExportError, match=r"^Outputs returns dict, the loss needs one tensor: wrap the model so that "
                                          r"forward returns it"):
        export_training_module(Outputs(), "cross_entropy", "sgd", tmp_path / "m.pt",
                               example_inputs=labelled(4, tensors=True))


def test_a_compiled_model_exports_the_module_it_compiled(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    compiled = torch.compile(model)
    optimizer = torch.optim.SGD(compiled.parameters(), lr=0.1)
    path = export_training_module(compiled, "cross_entropy", optimizer, tmp_path / "m.pt",
                                  example_inputs=labelled(4, tensors=True))
    assert load(str(path)).parameter_names() == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert _capture(path) == {"kind": "script", "checked": True, "draws_random": False}


def test_a_model_left_in_eval_mode_is_exported_to_train_in_training_mode(tmp_path):
    """Java trains the module in the mode it was saved in: training mode, as eager training runs."""
    from gradbridge.reference import Reference
    from gradbridge._runtime.torchscript import load_for_python

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3)).eval()
    x, y = labelled(8, tensors=True)
    path = export_training_module(model, "cross_entropy", ADAM, tmp_path / "m.pt", example_inputs=(x, y))
    assert not model.training  # the user's model is left as it was
    module, eager = load_for_python(path), Reference(path, model)
    for step in range(3):
        torch.manual_seed(step)
        loss = module.train_step(x, y)
        torch.manual_seed(step)
        assert torch.equal(loss, eager.train_step(x, y))


def test_an_unused_parameter_and_its_missing_optimizer_state_pass_the_check(tmp_path):
    class WithUnused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(6, 3)
            self.unused = torch.nn.Linear(6, 3)

        def forward(self, x):
            return self.used(x)

    path = export_training_module(WithUnused(), "cross_entropy", ADAM, tmp_path / "m.pt",
                                  example_inputs=labelled(8, tensors=True))
    assert _capture(path)["checked"]


def test_an_error_inside_the_check_is_one_line(tmp_path, monkeypatch):
    from gradbridge.reference import Reference

    def broken(self, x, y):
        raise RuntimeError("boom\n  at some line")

    monkeypatch.setattr(Reference, "backward", broken)
    with pytest.raises(ExportError, match=r"^export check failed: train_step 1 raised: boom at some line; check=False"):
        export_training_module(KeywordNet(), "cross_entropy", ADAM, tmp_path / "m.pt",
                               example_inputs=labelled(8, tensors=True),
                               format="torchscript")  # (format="auto" would go on to protocol 3's own check)
    assert list(tmp_path.iterdir()) == []


def test_parity_refuses_a_factory_of_another_model_in_one_line(tmp_path):
    path = export_training_module(KeywordNet(), "cross_entropy", ADAM, tmp_path / "m.pt",
                                  example_inputs=labelled(8, tensors=True))
    x, y = labelled(16, tensors=True)
    np.savez(tmp_path / "train.npz", x=x.numpy(), y=y.numpy())
    result = subprocess.run([sys.executable, "-m", "gradbridge", "parity", str(path), "--data", str(tmp_path / "train.npz"),
                             "--batch-size", "8", "--model-factory", "tests.models.custom:two_layer_regressor"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradbridge: error: ") and "is it this model's export?" in lines[0]


def test_state_kept_across_eval_calls_that_python_train_clears_is_refused_in_one_line(tmp_path):
    """The check evaluates before, between and after its steps: an eval-time cache that only the eager model's
    Python train() clears would serve stale values from Java (validation drifting while training is bitwise)."""
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    model = EvalCacheNet()
    with pytest.raises(ExportError) as info:
        export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters(), lr=0.1), tmp_path / "m.pt",
                               example_inputs=(x, y), format="torchscript")
    message = str(info.value)
    assert message.startswith("export check failed: evaluate (eval mode) after train_step 1: loss differs"), message
    assert "Python train()" in message and 'format="export"' in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("format", ["torchscript", "export"])
def test_the_check_holds_one_side_at_a_time_beside_the_users_model(tmp_path, monkeypatch, format):
    """Export at the size of the model: when a side of the check is built, nothing else the export made from
    the model is alive (its own copy, the other side), so a large model is held at most twice."""
    import gc
    import weakref

    from gradbridge.export import protocol3_check, capture, self_check

    made = []  # weak references to every copy of the model and every side of the check

    copy_model = capture.cpu_copy

    def tracked_copy(model, *values):
        copied = copy_model(model, *values)
        made.append(weakref.ref(copied))
        return copied

    def tracked(cls):
        init = cls.__init__

        def built(self, *args, **kwargs):
            gc.collect()
            assert not [ref() for ref in made if ref() is not None], f"{cls.__qualname__} built beside another copy"
            init(self, *args, **kwargs)
            made.append(weakref.ref(self))
        monkeypatch.setattr(cls, "__init__", built)

    monkeypatch.setattr(capture, "cpu_copy", tracked_copy)
    for side in (self_check._Eager, self_check._Module, protocol3_check._Eager, protocol3_check._Twin):
        tracked(side)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    before = {name: t.clone() for name, t in model.state_dict().items()}
    export_training_module(model, "cross_entropy", ADAM, tmp_path / "m.pt", example_inputs=labelled(8, tensors=True),
                           format=format)
    assert len(made) == 4  # the export's copy, the eager side and its copy, the module
    assert all(torch.equal(t, before[name]) for name, t in model.state_dict().items())
