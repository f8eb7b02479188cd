"""The model zoo (tests/models/zoo.py): models users fine-tune, as a user exports them in each format
(format="torchscript" and format="export"), trained from Java in this process and in a JVM of its own, against
the user's own eager nn.Module and torch.optim, bit for bit; or refused at export with their one line. Runs on
both ends of the torch range (`make test`); ResNet-18 (~35 s a case) on the newest torch with --full only, on
the oldest in every run; the cases marked full_only on both with --full only."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gradbridge._runtime import classpath, inputs, launcher
from gradbridge import export_training_module, java, reference
from gradbridge.errors import ExportError
from tests.models import zoo

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZER = {"name": "adamw", "lr": 1e-3}
EPOCHS, BATCH, SAMPLES = 2, 4, 8
#: the zoo's slowest cases, on the newest torch with --full only (every_torch_full)
NEWEST_WITH_FULL = {"ResNet-18 (BatchNorm)"}


def _case(case):
    if case.full_only:  # with --full, on both torches
        return pytest.param(case, marks=[pytest.mark.slow, pytest.mark.every_torch_full], id=case.name)
    mark = pytest.mark.every_torch_full if case.name in NEWEST_WITH_FULL else pytest.mark.every_torch_java
    return pytest.param(case, marks=mark, id=case.name)


def _one_or_named(arrays):
    return arrays["x"] if list(arrays) == ["x"] else arrays


def _same_run(mine, theirs, label):
    assert len(mine) == len(theirs) == EPOCHS
    for a, b in zip(mine, theirs):
        assert (a.loss, a.val_loss) == (b.loss, b.val_loss), f"{label}: epoch {a.epoch}"
        assert a.digests == b.digests, f"{label}: epoch {a.epoch} parameters differ"


@pytest.fixture
def own_jvm_on_this_torch(monkeypatch):
    """A JVM of its own on this Python's libtorch (as an installed wheel runs it): the classpath
    without the pytorch-native-cpu jar, so it is compared bit for bit too."""
    entries = [e for e in classpath.resolve().entries if not Path(e).name.startswith(classpath.NATIVE_JAR_PREFIX)]
    monkeypatch.setenv(classpath.CLASSPATH_ENV, os.pathsep.join(entries))


@pytest.mark.parametrize("format", ["torchscript", "export"])
@pytest.mark.parametrize("case", [_case(case) for case in zoo.CASES])
def test_zoo_model_trains_from_java_like_the_users_model_or_is_refused(jvm, own_jvm_on_this_torch, tmp_path, case,
                                                                        format):
    torch.manual_seed(0)
    model = case.build()
    x, y = case.data(SAMPLES, 0)
    vx, vy = case.data(BATCH, 1)
    path = tmp_path / "model.pt"
    example = (inputs.select(x, torch.arange(BATCH)), y[:BATCH])
    expected = case.expected(format)
    if expected != "bitwise":
        with pytest.raises((ExportError, ValueError)) as info:
            export_training_module(model, "cross_entropy", OPTIMIZER, path, example_inputs=example, format=format)
        assert str(info.value).startswith(expected), str(info.value)
        assert "\n" not in str(info.value) and not path.exists()
        return
    export_training_module(model, "cross_entropy", OPTIMIZER, path, example_inputs=example, format=format)
    as_numpy = lambda batch: {n: t.numpy() for n, t in inputs.arrays(batch).items()}  # noqa: E731
    arrays = dict(x=_one_or_named(as_numpy(x)), y=y.numpy(), val=(_one_or_named(as_numpy(vx)), vy.numpy()))
    settings = dict(epochs=EPOCHS, batch_size=BATCH, mode="step")
    eager = reference.train(path, model=model, **arrays, **settings)
    # step and fused train alike; protocol 3's fused epoch is the native layer's own loop
    in_process = dict(settings, mode="fused" if format == "export" else "step")
    _same_run(java.train(path, **arrays, **in_process), eager, "Java in this process")
    # the data files a user writes: one array per input, named as forward names it
    np.savez(tmp_path / "train.npz", **as_numpy(x), y=arrays["y"])
    np.savez(tmp_path / "val.npz", **as_numpy(vx), y=arrays["val"][1])
    separate = launcher.train(path, tmp_path / "train.npz", val=tmp_path / "val.npz", history=tmp_path / "h.jsonl",
                              **settings)
    _same_run(separate, eager, "Java in a JVM of its own")


@pytest.mark.every_torch_java
def test_the_docs_table_says_what_the_zoo_does():
    import timm
    import transformers

    guide = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    major = zoo.transformers_major()
    assert f"transformers {transformers.__version__}" in guide and f"timm {timm.__version__}" in guide
    for case in zoo.CASES:
        row = re.search(rf"^\| {re.escape(case.name)} \| {case.library} \| (.+?) \| (.+?) \|$", guide, re.MULTILINE)
        assert row, f"docs/export.md has no model-table row for {case.name}"
        for said, format in zip(row.groups(), ("torchscript", "export")):
            # a cell that differs by transformers major says "4.x: ...; 5.x: ..."
            part = re.search(rf"(?:^|; ){major}\.x: (.+?)(?:; \d+\.x: |$)", said)
            said = part.group(1) if part else said
            expected = case.expected(format)
            assert (said == "bitwise") if expected == "bitwise" else expected in said, (case.name, format, said)
