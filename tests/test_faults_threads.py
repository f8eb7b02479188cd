"""Fault suite, surface "threads": a second caller on a module in use is refused and changes nothing.

``Trainer.fit`` used to reseed libtorch's process-wide generator before the module's one-thread
check refused a second caller, so the refused call changed the first run's dropout masks; and the
module was held per step, so two runs interleaved. Now a run holds its module from start to end.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from gradbridge import export_training_module, java
from gradbridge.jvm import java_errors, jclass, load_module
from gradbridge.models import mlp

EPOCHS = 300


def _data(n=64, seed=0):
    g = np.random.default_rng(seed)
    x = g.standard_normal((n, 6)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


@pytest.fixture(scope="module")
def dropout_model(tmp_path_factory):
    torch.manual_seed(3)
    return export_training_module(mlp(6, (32, 32), 2, dropout=0.5), "cross_entropy", {"name": "sgd", "lr": 0.05},
                                  tmp_path_factory.mktemp("threads") / "dropout.pt",
                                  inputs=[{"name": "x", "shape": [-1, 6], "dtype": "float32"},
                                          {"name": "y", "shape": [-1], "dtype": "int64"}])


def _fit(module, x, y, epochs=EPOCHS):
    Trainer = jclass("dev.gradbridge.Trainer")
    with java_errors():
        train = java.dataset(module.getManager(), x, y, "training data")
        trainer = Trainer.builder().optEpochs(epochs).optBatchSize(8).optSeed(5).optRecordValues(False).build()
        return [str(line) for line in str(trainer.fit(module, train).toJsonLines()).splitlines()]


def _losses(lines):
    import json
    return [(json.loads(line)["loss"], json.loads(line)["digests"]) for line in lines]


def test_refused_second_fit_changes_nothing(jvm, dropout_model):
    x, y = _data()
    alone_module = load_module(dropout_model)
    try:
        started = time.time()
        alone = _losses(_fit(alone_module, x, y))
        assert time.time() - started > 1.5, "the run is too short to overlap reliably"
    finally:
        alone_module.close()

    module = load_module(dropout_model)
    results, refusals = {}, []
    try:
        first = threading.Thread(target=lambda: results.setdefault("first", _fit(module, x, y)))
        first.start()
        # Wait, without changing the module, until the first run holds it: a read is refused then.
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                module.getParameters()
            except Exception:  # noqa: BLE001 - ConcurrentUseException: the first run has the module
                break
            time.sleep(0.005)
        deadline = time.time() + 30
        while first.is_alive() and time.time() < deadline:
            try:
                # Succeeds only once the first run has let go of the module (its Java call returned
                # while its Python thread still parses the history): harmless then.
                _fit(module, x, y, epochs=1)
            except Exception as ex:  # noqa: BLE001 - the refusal is what the test looks for
                refusals.append(ex)
            time.sleep(0.01)
        first.join()
    finally:
        module.close()
    # A second fit that ran while the first held the module would show in the first run's numbers.
    assert refusals, "no overlapping call was made"
    assert all(getattr(ex, "java_class", "") == "dev.gradbridge.ConcurrentUseException" for ex in refusals), refusals
    assert "is in use by thread" in str(refusals[0])
    # The first run is the run it would have been alone, bit for bit (dropout masks included).
    assert _losses(results["first"]) == alone
