"""The Java Trainer in this process against gradbridge.reference.train: same shuffle, same seeds,
same History schema, bit for bit; checkpoints, resume and divergence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradbridge import DivergenceError, compare_histories, export_training_module, java, protocol, reference
from gradbridge.models import mlp

from .data import labelled

EPOCHS = 5


@pytest.fixture(scope="module")
def mlp_adam(tmp_path_factory):
    torch.manual_seed(0)
    x, y = labelled(100)
    return export_training_module(mlp(6, (16, 16), 3), "cross_entropy", {"name": "adam", "lr": 0.01},
                                  tmp_path_factory.mktemp("trainer") / "mlp.pt",
                                  example_inputs=(torch.from_numpy(x), torch.from_numpy(y)))


@pytest.fixture(scope="module")
def mlp_dropout(tmp_path_factory):
    torch.manual_seed(1)
    x, y = labelled(100)
    return export_training_module(mlp(6, (16, 16), 3, dropout=0.25), "cross_entropy",
                                  {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True},
                                  tmp_path_factory.mktemp("trainer") / "dropout.pt",
                                  example_inputs=(torch.from_numpy(x), torch.from_numpy(y)))


@pytest.mark.parametrize("mode", ["step", "fused", "full"])
def test_java_trainer_equals_reference(jvm, mlp_adam, mode):
    # Given shuffled mini-batches (seed 3), a validation set, an MLP with Adam
    x, y = labelled(100)
    val = labelled(40, seed=1)
    # When Java's Trainer and the eager reference train 5 epochs
    in_java = java.train(mlp_adam, x, y, epochs=EPOCHS, batch_size=16, seed=3, mode=mode, val=val)
    in_python = reference.train(mlp_adam, x, y, epochs=EPOCHS, batch_size=16, seed=3, mode=mode, val=val)
    # Then every epoch's loss, validation loss, parameters and digests are identical
    report = compare_histories(in_python, in_java)
    assert report.bitwise, report.table()
    assert [r.val_loss for r in in_java] == [r.val_loss for r in in_python]
    assert [r.digests for r in in_java] == [r.digests for r in in_python]
    assert in_java[-1].loss < in_java[0].loss


def test_dropout_runs_are_reproducible_across_languages(jvm, mlp_dropout):
    x, y = labelled(100)
    in_java = java.train(mlp_dropout, x, y, epochs=EPOCHS, batch_size=10, seed=9, mode="step")
    in_python = reference.train(mlp_dropout, x, y, epochs=EPOCHS, batch_size=10, seed=9, mode="step")
    assert compare_histories(in_python, in_java).bitwise


def test_digests_only_history(jvm, mlp_adam):
    x, y = labelled(100)
    history = java.train(mlp_adam, x, y, epochs=2, batch_size=32, record_values=False)
    assert history[0].parameters == {} and len(history[0].digests) == 6


def test_checkpoint_loads_in_python_and_predicts_what_java_predicts(jvm, mlp_adam, tmp_path):
    import jpype

    x, y = labelled(100)
    checkpoint = tmp_path / "trained.pt"
    # Java trains 3 epochs, writes the checkpoint, and predicts with the module it trained
    module = jvm.load_module(mlp_adam)
    try:
        with jvm.java_errors():
            training = java.dataset(x, y, "training data")
            trainer = (jpype.JClass("dev.gradbridge.Trainer").builder().optEpochs(3).optBatchSize(16).optSeed(3)
                       .optCheckpoint(jpype.JClass("java.nio.file.Paths").get(str(checkpoint))).build())
            trainer.fit(module, training)
            predicted = module.forward(jvm.to_tensor(x))
            java_predictions = np.array(predicted.toFloatArray(), dtype=np.float32).reshape(len(x), 3)
    finally:
        module.close()
    # Python's torch.jit.load of that file predicts exactly the same
    loaded = torch.jit.load(str(checkpoint))
    assert np.array_equal(loaded.forward(torch.from_numpy(x)).detach().numpy(), java_predictions)
    metadata = protocol.read_metadata(checkpoint)
    # The checkpoint records what the run depends on (see tests/test_faults_resume.py).
    saved = metadata["checkpoint"]
    assert {key: saved[key] for key in ("epochs_completed", "seed", "batch_size", "mode", "x_shape", "y_shape")} == {
        "epochs_completed": 3, "seed": 3, "batch_size": 16, "mode": "step", "x_shape": [100, 6], "y_shape": [100]}
    assert len(saved["data_sha256"]) == 64
    assert float(loaded.optimizer_state()["step"][0]) == 3 * 7  # 7 batches of 16 per epoch


def test_resume_three_plus_four_equals_seven(jvm, mlp_dropout, tmp_path):
    x, y = labelled(100)
    val = labelled(40, seed=1)
    seven = java.train(mlp_dropout, x, y, epochs=7, batch_size=16, seed=5, mode="fused", val=val)
    checkpoint = tmp_path / "run.pt"
    first = java.train(mlp_dropout, x, y, epochs=3, batch_size=16, seed=5, mode="fused", val=val,
                       checkpoint=checkpoint)
    rest = java.train(checkpoint, x, y, epochs=4, batch_size=16, seed=5, mode="fused", val=val)
    assert [r.epoch for r in rest] == [3, 4, 5, 6]
    from gradbridge import History

    report = compare_histories(seven, History(first.records + rest.records), labels=("uninterrupted", "resumed"))
    assert report.bitwise, report.table()
    python = reference.train(mlp_dropout, x, y, epochs=7, batch_size=16, seed=5, mode="fused", val=val)
    assert compare_histories(python, seven).bitwise


def test_divergence_is_named_and_the_checkpoint_stays(jvm, tmp_path):
    torch.manual_seed(0)
    x = np.random.default_rng(2).standard_normal((32, 6)).astype(np.float32) * 100
    y = np.random.default_rng(3).standard_normal((32, 1)).astype(np.float32)
    path = export_training_module(mlp(6, (8,), 1), "mse", {"name": "sgd", "lr": 10.0}, tmp_path / "wild.pt",
                                  example_inputs=(torch.from_numpy(x), torch.from_numpy(y)))
    checkpoint = tmp_path / "wild-checkpoint.pt"
    with pytest.raises(DivergenceError, match=r"loss is (NaN|Infinity) at epoch \d+, batch \d+") as info:
        java.train(path, x, y, epochs=50, batch_size=8, checkpoint=checkpoint)
    with pytest.raises(DivergenceError, match=r"loss is (NaN|Infinity) at epoch \d+, batch \d+"):
        reference.train(path, x, y, epochs=50, batch_size=8)
    # The checkpoint holds exactly the epochs completed before the divergence (none: no file).
    done = len(info.value.history)
    assert f"at epoch {done}," in str(info.value)
    if done == 0:
        assert not checkpoint.exists()
    else:
        assert protocol.read_metadata(checkpoint)["checkpoint"]["epochs_completed"] == done


def test_bad_data_from_python_is_named(jvm, mlp_adam):
    from gradbridge import InvalidInputError

    x, y = labelled(100)
    with pytest.raises(InvalidInputError, match=r"training data: x must be float32 of shape \[-1, 6\]"):
        java.train(mlp_adam, x.astype(np.float64), y, epochs=1)
    bad = x.copy()
    bad[5, 2] = np.nan
    with pytest.raises(InvalidInputError, match="training data: x holds NaN or infinite values"):
        java.train(mlp_adam, bad, y, epochs=1)
    with pytest.raises(InvalidInputError, match=r"batch size must be in 1\.\.100"):
        java.train(mlp_adam, x, y, epochs=1, batch_size=101)
