"""Fault suite, surface "threads": a second caller on a module in use is refused and changes nothing.

``Trainer.fit`` used to reseed libtorch's process-wide generator before the module's one-thread
check refused a second caller, so the refused call changed the first run's dropout masks; and the
module was held per step, so two runs interleaved. Now a run holds its module from start to end.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from gradbridge import export_training_module, java
from gradbridge.jvm import java_errors, jclass, load_module
from gradbridge.models import mlp

from .data import labelled

EPOCHS = 900  # long enough (> 2 s alone) for a second thread to arrive mid-run, even after the per-call speed-ups


@pytest.fixture(scope="module")
def dropout_model(tmp_path_factory):
    torch.manual_seed(3)
    return export_training_module(mlp(6, (32, 32), 2, dropout=0.5), "cross_entropy", {"name": "sgd", "lr": 0.05},
                                  tmp_path_factory.mktemp("threads") / "dropout.pt",
                                  inputs=[{"name": "x", "shape": [-1, 6], "dtype": "float32"},
                                          {"name": "y", "shape": [-1], "dtype": "int64"}])


def _fit(module, x, y, epochs=EPOCHS, inside=None, done=None):
    """Trainer.fit on ``module``; ``inside``/``done`` (Events) are set right before and after the Java call."""
    Trainer = jclass("dev.gradbridge.Trainer")
    with java_errors():
        train = java.dataset(x, y, "training data")
        trainer = Trainer.builder().optEpochs(epochs).optBatchSize(8).optSeed(5).optRecordValues(False).build()
        if inside is not None:
            inside.set()
        try:
            history = trainer.fit(module, train)
        finally:
            if done is not None:
                done.ended = time.monotonic()
                done.set()
        return [str(line) for line in str(history.toJsonLines()).splitlines()]


def _losses(lines):
    import json
    return [(json.loads(line)["loss"], json.loads(line)["digests"]) for line in lines]


def test_refused_second_fit_changes_nothing(jvm, dropout_model):
    x, y = labelled(64, classes=2)
    alone_module = load_module(dropout_model)
    try:
        started = time.monotonic()
        alone = _losses(_fit(alone_module, x, y))
        assert time.monotonic() - started > 2, "the run is too short to overlap reliably"
    finally:
        alone_module.close()

    module = load_module(dropout_model)
    results, attempts = {}, []
    inside, done = threading.Event(), threading.Event()
    try:
        first = threading.Thread(target=lambda: results.setdefault("first", _fit(module, x, y, inside=inside,
                                                                                 done=done)))
        first.start()
        assert inside.wait(30)
        time.sleep(1.0)  # the first run takes the module as it enters fit; it then runs for seconds
        while not done.is_set():
            began = time.monotonic()
            try:
                _fit(module, x, y, epochs=1)
                attempts.append((began, time.monotonic(), None))
            except Exception as ex:  # noqa: BLE001 - the refusal is what the test looks for
                attempts.append((began, time.monotonic(), ex))
            time.sleep(0.01)
        first.join()
    finally:
        module.close()
    refusals = [ex for _, _, ex in attempts if ex is not None]
    assert refusals, "no overlapping call was made"
    assert all(getattr(ex, "java_class", "") == "dev.gradbridge.ConcurrentUseException" for ex in refusals), refusals
    assert "is in use by thread" in str(refusals[0])
    # A second fit may only have run once the first had finished.
    assert all(ended > done.ended for _, ended, ex in attempts if ex is None), attempts
    # The first run is the run it would have been alone, bit for bit (dropout masks included).
    assert _losses(results["first"]) == alone
