"""Java's training step against eager PyTorch on the same GPU (tools/gpu_check.sh runs it): ResNet-18 and a
transformer encoder (gradbridge bench's cases), torch's deterministic algorithms on for both.

For each model: eager PyTorch + torch.optim (``reference.Reference`` on the device, torch.optim's
single-tensor path, the batch copied to the GPU and the loss read back every step), Java's ``trainStep`` (the
same per step: one call, the batch copied in, the loss read back) and Java's fused ``trainEpoch`` (the epoch's
steps in one call, the losses read back at its end), Java in this process (JPype). Each is timed in ROUNDS
rounds of STEPS steps after a warm-up; the table gives the median time per step, the rounds' range, and Java's
median over eager's.

    python tools/gpu_bench.py [--device cuda:0] [--rounds 5] [--steps 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from gradbridge import export_training_module, java, jvm  # noqa: E402
from gradbridge._runtime import devices  # noqa: E402
from gradbridge.bench import cases  # noqa: E402
from gradbridge.reference import Reference  # noqa: E402

MODELS = ("resnet18", "transformer")


def _rounds(run: Callable[[], None], rounds: int, warmup: int, sync: Callable[[], None]) -> List[float]:
    """Seconds of each round of ``run`` (a round's steps), after ``warmup`` rounds."""
    times = []
    for index in range(warmup + rounds):
        sync()
        started = time.perf_counter()
        run()
        sync()
        if index >= warmup:
            times.append(time.perf_counter() - started)
    return times


def bench(key: str, device: str, rounds: int, steps: int, folder: Path) -> dict:
    case = next(c for c in cases.CASES if c.key == key)
    torch.manual_seed(0)
    model = case.build()
    xb, yb = cases._data(case, case.batch)
    path = export_training_module(model, case.loss, case.optimizer, folder / f"{key}.pt",
                                  example_inputs=(torch.from_numpy(xb), torch.from_numpy(yb)), format="torchscript")
    x, y = cases._data(case, case.batch * steps, seed=1)
    with devices.deterministic(device):
        return _timed(case, path, model, x, y, device, rounds, steps)


def _timed(case, path: Path, model, x, y, device: str, rounds: int, steps: int) -> dict:
    sync = (lambda: torch.cuda.synchronize(device)) if devices.is_cuda(device) else (lambda: None)
    batches = [(torch.from_numpy(x[i:i + case.batch]), torch.from_numpy(y[i:i + case.batch]))
               for i in range(0, len(y), case.batch)]

    eager = Reference(path, model, device=device)

    def eager_round():
        for xs, ys in batches:
            float(eager.train_step(xs, ys))  # the loss read back, as Java's step does

    result = {"model": case.name, "eager": _rounds(eager_round, rounds, 1, sync)}
    del eager

    module = jvm.load_module(path, device=device)
    data = java.dataset(x, y, "benchmark data")
    step_data = [java.dataset(xs.numpy(), ys.numpy(), "benchmark batch") for xs, ys in batches]
    try:
        pairs = [(d.getInputs(), d.getY()) for d in step_data]

        def java_round():
            for xs, ys in pairs:
                module.trainStep(xs, ys)

        result["java step"] = _rounds(java_round, rounds, 1, sync)
        Tensor = jvm.jclass("dev.gradbridge.Tensor")
        order = Tensor.of(jvm.jclass("long[]")(list(range(len(y)))), len(y))
        try:
            result["java fused"] = _rounds(lambda: module.trainEpoch(data.getInputs(), data.getY(), order, case.batch),
                                           rounds, 1, sync)
        finally:
            order.close()
    finally:
        for d in (data, *step_data):
            d.close()
        module.close()
    for variant in ("eager", "java step", "java fused"):
        result[variant] = [t / steps * 1e3 for t in result[variant]]  # ms per step
    return result


def table(results: List[dict], device: str) -> str:
    name = torch.cuda.get_device_name(device) if devices.is_cuda(device) else "CPU"
    on = ", deterministic algorithms on" if devices.is_cuda(device) else ""
    lines = [f"step benchmark on {device} ({name}), torch {torch.__version__}{on}; "
             "ms per step: median [min-max] over rounds; ratio: Java's median / eager's",
             f"{'model':<64} {'eager':>22} {'Java step':>22} {'ratio':>6} {'Java fused':>22} {'ratio':>6}"]

    def cell(times):
        return f"{statistics.median(times):8.3f} [{min(times):.3f}-{max(times):.3f}]"

    for r in results:
        eager = statistics.median(r["eager"])
        lines.append(f"{r['model']:<64} {cell(r['eager']):>22} {cell(r['java step']):>22} "
                     f"{statistics.median(r['java step']) / eager:6.2f} {cell(r['java fused']):>22} "
                     f"{statistics.median(r['java fused']) / eager:6.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    device = devices.require(args.device)
    with tempfile.TemporaryDirectory() as folder:
        results = [bench(key, device, args.rounds, args.steps, Path(folder)) for key in args.models]
    text = table(results, device)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
