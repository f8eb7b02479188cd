"""`gradbridge demo`: the seed's linear regression trained from Java twice, checked against Python.

1. export the seed model;
2. `gradle run` trains it in a separate JVM (DJL's own libtorch) and writes a history;
3. the same Java driver trains it inside this process (JPype, the libtorch of `import torch`);
4. eager PyTorch + torch.optim.SGD trains it on the same data;
5. per-epoch parity tables: in-process (expected bitwise) and subprocess (tolerance below).
"""

from __future__ import annotations

import time
from pathlib import Path

from . import java, reference
from .export import export_builtin
from .gradle import run_task
from .history import History
from .parity import compare_histories

LR = 0.01
#: gradle run uses DJL's libtorch build, not pip's: kernels may round differently in the last
#: bits, so that comparison allows float32-level relative differences.
SUBPROCESS_RTOL = 1e-5
SUBPROCESS_ATOL = 1e-6


def run_demo(*, epochs: int, out_dir: str | Path) -> int:
    out = Path(out_dir).resolve()
    model = out / "linear_regression.pt"
    java_history_file = out / "history-gradle-run.jsonl"
    export_builtin("linear-regression", model, seed=0, lr=LR)
    print(f"[1/4] exported {model}")

    print(f"[2/4] gradle run -Pargs=\"--model {model} --epochs {epochs} --log-every {max(epochs // 5, 1)} --history ...\"")
    started = time.perf_counter()
    gradle = run_task("run", ["--model", model, "--epochs", epochs, "--lr", LR,
                              "--log-every", max(epochs // 5, 1), "--history", java_history_file], capture=False)
    if gradle.returncode != 0:
        print(f"gradle run failed with exit code {gradle.returncode}")
        return gradle.returncode
    print(f"      gradle run took {time.perf_counter() - started:.1f} s")

    x, y = java.seed_data()
    java_inprocess = java.train_linear_regression(model, x, y, epochs=epochs, lr=LR)
    print(f"[3/4] trained in this process from Java (JPype): final weight {java_inprocess[-1].parameters['weight'][0]:.4f}, "
          f"bias {java_inprocess[-1].parameters['bias'][0]:.4f}")
    python = reference.train_full_batch(model, x, y, epochs=epochs, lr=LR)
    print("[4/4] trained in eager PyTorch (torch.optim.SGD) on the same data\n")

    every = max(epochs // 10, 1)
    inprocess = compare_histories(python, java_inprocess, labels=("python", "java"))
    print("Parity, Java in this process vs eager PyTorch (exact comparison):")
    print(inprocess.table(every=every), "\n")
    subprocess_report = compare_histories(python, History.load(java_history_file), rtol=SUBPROCESS_RTOL,
                                          atol=SUBPROCESS_ATOL, labels=("python", "gradle"))
    print(f"Parity, `gradle run` (own libtorch) vs eager PyTorch (rtol {SUBPROCESS_RTOL:g}, atol {SUBPROCESS_ATOL:g}):")
    print(subprocess_report.table(every=every))
    ok = inprocess.within_tolerance and subprocess_report.within_tolerance
    return 0 if ok else 1
