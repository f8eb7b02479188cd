"""`gradbridge demo`: the seed's linear regression trained from Java twice, checked against Python.

1. export the seed model;
2. the Java seed driver trains it in a JVM of its own (`java`, see gradbridge._runtime.launcher) and writes
   a history: the pytorch-native-cpu jar's libtorch in a checkout, the pip libtorch from an installed wheel;
3. the same Java driver trains it inside this process (JPype, the libtorch of `import torch`);
4. eager PyTorch + torch.optim.SGD trains it on the same data;
5. per-epoch parity tables: in-process (expected bitwise) and subprocess (tolerance below).
"""

from __future__ import annotations

import time
from pathlib import Path

from .. import java, reference
from .._runtime import launcher, torch_gate
from ..export import export_builtin
from ..history import History
from ..models import SEED_LR as LR
from ..parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL, compare_histories


def run_demo(*, epochs: int, out_dir: str | Path) -> int:
    out = Path(out_dir).resolve()
    model = out / "linear_regression.pt"
    java_history_file = out / "history-separate-jvm.jsonl"
    torch_gate.require_torch()  # before anything is written
    export_builtin("linear-regression", model, seed=0, lr=LR)
    print(f"[1/4] exported {model}")

    args = ["--model", model, "--epochs", epochs, "--lr", LR, "--log-every", max(epochs // 5, 1),
            "--history", java_history_file]
    print(f"[2/4] java {launcher.SEED_MAIN} {' '.join(map(str, args[:-1]))} ... (a JVM of its own)")
    started = time.perf_counter()
    launcher.run(launcher.SEED_MAIN, args, capture=False)
    print(f"      the separate JVM took {time.perf_counter() - started:.1f} s")

    x, y = java.seed_data()
    java_inprocess = java.train(model, x, y, epochs=epochs, mode="full", lr=LR)
    print(f"[3/4] trained in this process from Java (JPype): final weight {java_inprocess[-1].parameters['weight'][0]:.4f}, "
          f"bias {java_inprocess[-1].parameters['bias'][0]:.4f}")
    python = reference.train(model, x, y, epochs=epochs, mode="full", lr=LR)
    print("[4/4] trained in eager PyTorch (torch.optim.SGD) on the same data\n")

    every = max(epochs // 10, 1)
    inprocess = compare_histories(python, java_inprocess, labels=("python", "java"))
    print("Parity, Java in this process vs eager PyTorch (exact comparison):")
    print(inprocess.table(every=every), "\n")
    subprocess_report = compare_histories(python, History.load(java_history_file), rtol=SEPARATE_JVM_RTOL,
                                          atol=SEPARATE_JVM_ATOL, labels=("python", "java-jvm"))
    print(f"Parity, Java in its own JVM vs eager PyTorch (rtol {SEPARATE_JVM_RTOL:g}, atol {SEPARATE_JVM_ATOL:g}):")
    print(subprocess_report.table(every=every))
    ok = inprocess.within_tolerance and subprocess_report.within_tolerance
    return 0 if ok else 1
