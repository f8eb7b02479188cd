"""Training on a CUDA device (marker ``cuda``: skipped with the reason "no CUDA device" where torch sees none;
tools/gpu_check.sh runs these on a GPU machine).

Each case is exported from the model on the GPU (the file holds CPU tensors and records where it came from),
then trained on ``cuda:0`` by eager PyTorch (``reference.train(device=...)``), by Java in this process (the
same libtorch: bit for bit) and by Java in a JVM of its own on this Python's libtorch (its CUDA libraries
loaded at start: compared within ``parity.SEPARATE_JVM_*``, and said whether bitwise), both formats, with
torch's deterministic algorithms on. The cases: the seed model (full batch, SGD), an MLP with dropout (CUDA's
generator), the zoo's BERT with its attention mask, torchvision's ResNet-18 with BatchNorm. Checkpoints move
between the GPU and the CPU with their optimizer state.

``GRADBRIDGE_CUDA_TESTS_ON=cpu`` rehearses these tests on the CPU (their code runs, nothing about CUDA is
checked): a development aid, not a GPU result.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Tuple

import numpy as np
import pytest
import torch
from torch import nn

from gradbridge import compare_histories, export_training_module, java, protocol, reference
from gradbridge._runtime import inputs, launcher
from gradbridge.export.finetune import state_dict_of
from gradbridge.models import LinearRegression, SEED_LR, mlp
from gradbridge.parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL
from tests.models import zoo

pytestmark = pytest.mark.cuda

#: what these tests train on: the GPU, or the CPU for a rehearsal (module docstring)
DEVICE = "cpu" if os.environ.get("GRADBRIDGE_CUDA_TESTS_ON") == "cpu" else "cuda:0"
FORMATS = ("torchscript", "export")
#: (case, format, where Java ran, report) of every comparison, for the summary table (conftest)
RESULTS: List[Tuple[str, str, str, Any]] = []


def _seed_data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 10
    return x, 2 * x + 1 + (torch.rand(n, 1, generator=g) - 0.5) * 2


def _features(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] > 0).to(torch.int64) + (x[:, 1] > 0)


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], nn.Module]
    data: Callable[[int, int], Tuple[Any, torch.Tensor]]
    loss: str
    optimizer: dict
    mode: str
    samples: int
    batch: int
    epochs: int


CASES = (
    Case("seed model", LinearRegression, _seed_data, "mse", {"name": "sgd", "lr": SEED_LR}, "full", 100, 100, 20),
    Case("MLP with dropout", lambda: mlp(6, (32, 32), 3, dropout=0.25), _features, "cross_entropy",
         {"name": "adam", "lr": 0.01}, "step", 64, 16, 3),
    Case("BERT (attention mask)", zoo.bert, zoo._tokens, "cross_entropy", {"name": "adamw", "lr": 1e-3}, "step", 16, 4,
         2),
    Case("ResNet-18 (BatchNorm)", zoo.resnet18, zoo._images, "cross_entropy", {"name": "adamw", "lr": 1e-3}, "step", 16,
         4, 2),
)


def _numpy(x):
    arrays = {n: t.numpy() for n, t in inputs.arrays(x).items()}
    return arrays["x"] if list(arrays) == ["x"] else arrays


def _on(x, device):
    return {n: t.to(device) for n, t in x.items()} if isinstance(x, dict) else x.to(device)


def _same_bits(a, b) -> bool:
    return compare_histories(a, b).bitwise


@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_java_trains_like_eager_pytorch_on_the_gpu(jvm, tmp_path, case, format):
    torch.manual_seed(0)
    model = case.build().to(DEVICE)
    x, y = case.data(case.samples, 0)
    example = (_on(inputs.select(x, torch.arange(max(case.batch, 2))), DEVICE), y[:max(case.batch, 2)].to(DEVICE))
    path = export_training_module(model, case.loss, case.optimizer, tmp_path / "model.pt", example_inputs=example,
                                  format=format)
    # the file holds CPU tensors, and says where the model was
    capture = protocol.read_metadata(path)[protocol.CAPTURE_KEY]
    assert capture.get(protocol.EXPORTED_FROM_KEY) == (None if DEVICE == "cpu" else DEVICE)
    if format == "torchscript":
        assert all(t.device.type == "cpu" for t in torch.jit.load(str(path)).parameters())
    arrays = dict(x=_numpy(x), y=y.numpy())
    settings = dict(epochs=case.epochs, batch_size=case.batch, mode=case.mode, seed=1)
    eager = reference.train(path, model=model, device=DEVICE, **arrays, **settings)
    if DEVICE != "cpu":
        assert all((r.device, r.deterministic) == (DEVICE, True) for r in eager)
    in_process = java.train(path, device=DEVICE, **arrays, **settings)
    report = compare_histories(eager, in_process)
    RESULTS.append((case.name, format, "in-process", report))
    assert [(r.device, r.deterministic) for r in in_process] == [(r.device, r.deterministic) for r in eager]
    assert report.bitwise, report.table()
    if case.mode == "step":  # fused: the epoch in one native call, its losses read back at its end
        fused = java.train(path, device=DEVICE, **arrays, **dict(settings, mode="fused"))
        assert _same_bits(eager, fused), compare_histories(eager, fused).table()
    np.savez(tmp_path / "train.npz", **{n: t.numpy() for n, t in inputs.arrays(x).items()}, y=arrays["y"])
    separate = launcher.train(path, tmp_path / "train.npz", history=tmp_path / "h.jsonl", device=DEVICE, **settings)
    report = compare_histories(eager, separate, rtol=SEPARATE_JVM_RTOL, atol=SEPARATE_JVM_ATOL)
    RESULTS.append((case.name, format, "own JVM", report))
    assert [(r.device, r.deterministic) for r in separate] == [(r.device, r.deterministic) for r in eager]
    assert report.within_tolerance, report.table()


def _adam_mlp(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return export_training_module(mlp(6, (16,), 3), "cross_entropy", {"name": "adam", "lr": 0.01}, tmp_path / "m.pt",
                                  example_inputs=(torch.zeros(4, 6), torch.zeros(4, dtype=torch.int64)))


def _optimizer_state(jvm, path: Path, device: str):
    module = jvm.load_module(path, device=device)
    try:
        assert str(module.getDevice()) == device
        return {str(k): [np.array(v) for v in values] for k, values in module.getOptimizerState().items()}
    finally:
        module.close()


def test_a_gpu_checkpoint_resumes_on_the_cpu_and_the_other_way(jvm, tmp_path):
    path = _adam_mlp(tmp_path)
    x, y = (t.numpy() for t in _features(48, 0))
    settings = dict(batch_size=16, seed=2, mode="step")
    on_gpu = tmp_path / "gpu.pt"
    first = java.train(path, x, y, epochs=1, device=DEVICE, checkpoint=on_gpu, **settings)
    # CPU tensors in the file: torch.jit.load without a map location, gradbridge state-dict
    assert all(t.device.type == "cpu" for t in torch.jit.load(str(on_gpu)).parameters())
    assert all(t.device.type == "cpu" for t in state_dict_of(on_gpu).values())
    with zipfile.ZipFile(on_gpu) as archive:
        pickled = b"".join(archive.read(n) for n in archive.namelist() if n.endswith(".pkl"))
    assert b"cuda" not in pickled
    # the optimizer state reads back the same on either device
    state = _optimizer_state(jvm, on_gpu, DEVICE)
    assert state and state.keys() == _optimizer_state(jvm, on_gpu, "cpu").keys()
    for key, values in _optimizer_state(jvm, on_gpu, "cpu").items():
        assert all(np.array_equal(a, b) for a, b in zip(values, state[key])), key
    # resumed on the CPU, then on the GPU again: the run goes on where it stopped
    on_cpu = tmp_path / "cpu.pt"
    second = java.train(on_gpu, x, y, epochs=1, checkpoint=on_cpu, **settings)
    third = java.train(on_cpu, x, y, epochs=1, device=DEVICE, **settings)
    assert [r.epoch for r in (*first, *second, *third)] == [0, 1, 2]
    assert second[0].device is None and third[0].device == (None if DEVICE == "cpu" else DEVICE)


def test_a_trainer_moves_a_module_loaded_on_the_cpu_to_its_device(jvm, tmp_path):
    import jpype

    path = _adam_mlp(tmp_path)
    x, y = (t.numpy() for t in _features(48, 0))
    module = jvm.load_module(path)
    data = java.dataset(x, y, "training data")
    try:
        trainer = jpype.JClass("dev.gradbridge.Trainer").builder().optEpochs(2).optBatchSize(16).optSeed(2) \
            .optDevice(DEVICE).build()
        moved = jvm_history(trainer.fit(module, data))
        assert str(module.getDevice()) == DEVICE
    finally:
        data.close()
        module.close()
    loaded = java.train(path, x, y, epochs=2, batch_size=16, seed=2, device=DEVICE)
    assert _same_bits(loaded, moved), compare_histories(loaded, moved).table()


def jvm_history(history):
    from gradbridge import History

    return History.from_java(history)
