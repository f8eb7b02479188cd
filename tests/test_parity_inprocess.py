"""Java (gradbridge's native layer, in this process through JPype) and eager PyTorch train the seed model identically."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gradbridge import java
from gradbridge import compare_histories, reference

pytestmark = pytest.mark.every_torch_java

EPOCHS = 300
LR = 0.01


def test_java_in_process_equals_eager_pytorch_bit_for_bit(jvm, model_path):
    # Given the Java generator's data and the same exported initial parameters
    x, y = java.seed_data(seed=42, n=100)
    # When Java and eager torch.optim.SGD each train for EPOCHS full-batch epochs
    in_java = java.train(model_path, x, y, epochs=EPOCHS, mode="full", lr=LR)
    python = reference.train(model_path, x, y, epochs=EPOCHS, mode="full", lr=LR)
    # Then loss and every parameter agree to the last bit at every epoch
    report = compare_histories(python, in_java)
    assert len(report.rows) == EPOCHS
    assert report.bitwise, report.table(every=EPOCHS // 10)
    assert in_java[0].loss > in_java[-1].loss


def test_seed_data_is_the_seeds_generator(jvm):
    x, y = java.seed_data(seed=42, n=100)
    assert x.shape == y.shape == (100, 1) and x.dtype == y.dtype
    assert 0.0 <= x.min() and x.max() < 10.0
    noise = y - (2.0 * x + 1.0)
    assert -1.0001 <= noise.min() and noise.max() < 1.0001


def test_java_runs_on_the_libtorch_that_python_loaded(jvm, model_path):
    # One libtorch per process: every mapped libtorch_cpu.so is the one inside the torch package.
    jvm.load_module(model_path).close()
    torch_lib = (Path(torch.__file__).parent / "lib").resolve()
    mapped = {Path(line.split()[-1]).resolve() for line in Path("/proc/self/maps").read_text().splitlines()
              if line.rstrip().endswith("libtorch_cpu.so")}
    assert mapped == {torch_lib / "libtorch_cpu.so"}
