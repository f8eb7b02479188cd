"""Real models, whole calls: ``java.train`` (in this process, fused) against ``reference.train`` (eager), and
every parameter value recorded against digests only; losses compared in every round.

Models: torchvision ResNet-18, MobileNetV3-small, ShuffleNetV2 x0.5 (32x32 images) and the bench's
transformer encoder, random weights, Adam, batch 32, 2 epochs a call. Environment: ROUNDS (default 5),
N samples (default 256), NO_VALUES=1 skips the recorded-values run, THREADS (torch's intra-op threads,
default one per core), CLOCK=cpu times the process's CPU (all threads) instead of the wall (a loaded
machine's CPU time is steadier than its wall time).

    python benchmarks/real_models.py [resnet18 mobilenet_v3_small shufflenet_v2_x0_5 transformer]
"""
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torchvision

from gradbridge import export_training_module, java, reference
from gradbridge.bench.cases import _Encoder

MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), (3, 32, 32)),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=10), (3, 32, 32)),
    "shufflenet_v2_x0_5": (lambda: torchvision.models.shufflenet_v2_x0_5(num_classes=10), (3, 32, 32)),
    "transformer": (_Encoder, (64, 128)),
}


def spread(values):
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main(names):
    if os.environ.get("THREADS"):
        torch.set_num_threads(int(os.environ["THREADS"]))  # Java in this process shares libtorch's pool
    clock = time.process_time if os.environ.get("CLOCK") == "cpu" else time.perf_counter
    rounds, n = int(os.environ.get("ROUNDS", 5)), int(os.environ.get("N", 256))
    variants = ["eager", "java"] + ([] if os.environ.get("NO_VALUES") else ["java+values"])
    folder = tempfile.mkdtemp()
    for name in names:
        build, shape = MODELS[name]
        g = np.random.default_rng(0)
        x = g.standard_normal((n, *shape)).astype(np.float32)
        y = g.integers(0, 10, n).astype(np.int64)
        torch.manual_seed(0)
        path = export_training_module(build(), "cross_entropy", {"name": "adam", "lr": 1e-3},
                                      os.path.join(folder, name + ".pt"),
                                      example_inputs=(torch.from_numpy(x[:32]), torch.from_numpy(y[:32])))
        java.train(path, x[:32], y[:32], epochs=1, mode="fused", record_values=False)  # the native library, the JIT
        times = {v: [] for v in variants}
        same = True
        for _ in range(rounds):  # interleaved: the machine's drift hits every variant alike
            for variant in variants:
                started = clock()
                if variant == "eager":
                    history = reference.train(path, x, y, epochs=2, mode="fused", record_values=False)
                    expected = list(history.losses)
                else:
                    history = java.train(path, x, y, epochs=2, mode="fused", record_values=variant == "java+values")
                    same = same and list(history.losses) == expected
                times[variant].append(clock() - started)
        line = (f"{name}: eager {statistics.median(times['eager']) / 2:.3f} s/epoch; java/eager "
                f"{spread([j / e for j, e in zip(times['java'], times['eager'])])}")
        if "java+values" in times:
            line += f"; values/digests {spread([v / j for v, j in zip(times['java+values'], times['java'])])}"
        print(f"{line}; losses bitwise: {same}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
