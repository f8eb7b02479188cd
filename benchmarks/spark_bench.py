"""gradbridge-spark figures: steps/s on local[1] vs local[2], bytes moved per step, combine vs
compute time, a scaling model for N executors at 1 and 10 Gb/s, next to the single-process Java
Trainer on the same data. A benchmark, not a test.

    PYTHONPATH=python .venv/bin/python benchmarks/spark_bench.py [--out build/bench/spark.json]

Needs `gradle assemble` (the Spark classpath file). Models and data are gradbridge bench's MLP
(32-64-64-10, batch 64, Adam) and compute-bound MLP (512-1024-512-10, batch 1024, Adam).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gradbridge import launcher, sparkrun
from gradbridge.commands import bench
from gradbridge.export import export_training_module
from gradbridge.history import History

# (bench case, samples, epochs): the first epoch is warm-up, steps/s come from the later ones
CASES = [(bench.CASES[1], 2048, 3), (bench.CASES[2], 4096, 3)]
BANDWIDTHS = {"1 Gb/s": 1e9 / 8, "10 Gb/s": 10e9 / 8}
ROUNDS = 2  # every run twice, the faster one kept: the machine is shared
EXECUTORS = (1, 2, 4, 8, 16, 32, 64)


def _steady_steps_per_s(history: History, steps_per_epoch: int) -> float:
    elapsed = [r.elapsed_s for r in history]
    return steps_per_epoch * (len(elapsed) - 1) / (elapsed[-1] - elapsed[0])


def _run_case(case, samples: int, epochs: int, folder: Path) -> dict:
    import torch

    torch.manual_seed(0)
    model = case.build()
    x, y = bench._data(case, samples)
    path = export_training_module(model, case.loss, case.optimizer, folder / f"{case.name.split()[0]}.pt",
                                  example_inputs=(torch.from_numpy(x[:2]), torch.from_numpy(y[:2])))
    data = folder / f"{case.name.split()[0]}.npz"
    np.savez(data, x=x, y=y)
    steps_per_epoch = -(-samples // case.batch)
    out = {"case": case.name, "parameters": sum(p.numel() for p in model.parameters()), "batch": case.batch,
           "samples": samples, "epochs": epochs, "steps_per_epoch": steps_per_epoch}
    for k in (1, 2):
        history, stats = folder / f"h{k}.jsonl", folder / f"s{k}.json"
        best = None
        for _ in range(ROUNDS):
            started = time.perf_counter()
            sparkrun.run(["--model", path, "--data", data, "--master", f"local[{k}]", "--epochs", epochs,
                          "--batch-size", case.batch, "--history", history, "--stats", stats, "--digests-only"],
                         timeout=1800)
            run = (_steady_steps_per_s(History.load(history), steps_per_epoch), time.perf_counter() - started,
                   json.loads(stats.read_text()))
            best = run if best is None or run[0] > best[0] else best
        s = best[2]
        steps = s["steps"]
        out[f"local[{k}]"] = {
            "steps_per_s": best[0],
            "wall_s": best[1],
            "per_step_ms": {"total": 1e3 * s["step_s"] / steps, "spark_job": 1e3 * s["job_s"] / steps,
                            "compute_slowest_partition": 1e3 * s["compute_s"] / steps,
                            "combine_and_step_driver": 1e3 * s["combine_s"] / steps},
            "bytes_per_step": {"parameters_down": s["bytes_down"] // steps, "gradients_up": s["bytes_up"] // steps},
            "module_loads": s["module_loads"],
        }
    history = folder / "trainer.jsonl"
    rates = []
    for _ in range(ROUNDS):
        # the same JVM options, classpath and libtorch (this Python's) as the Spark runs
        subprocess.run(sparkrun.command(["--model", path, "--data", data, "--epochs", epochs, "--batch-size", case.batch,
                                         "--history", history, "--digests-only", "--no-progress"],
                                        main=launcher.TRAIN_MAIN),
                       check=True, capture_output=True, text=True, timeout=1800)
        rates.append(_steady_steps_per_s(History.load(history), steps_per_epoch))
    out["trainer"] = {"steps_per_s": max(rates)}
    out["model"] = _scaling_model(out)
    return out


def _scaling_model(out: dict) -> dict:
    """Per step on N executors, each on its own machine (the driver collects; no tree):
        T(N) = C1 / N + S + N * c + 2 * N * P / BW
    all measured on local[1]: C1 the compute of the whole batch in one partition; S Spark's per-step
    job overhead there (job time minus compute: scheduling, broadcast, (de)serialization, in-process
    transfer); c the driver's combine + optimizer step for one partition's gradients; P the
    parameter bytes sent to each executor = the gradient bytes each sends back. Ideal compute
    scaling and a per-step overhead that does not grow with N are assumptions (optimistic)."""
    one = out["local[1]"]["per_step_ms"]
    compute = one["compute_slowest_partition"] / 1e3
    overhead = (one["spark_job"] - one["compute_slowest_partition"]) / 1e3
    combine = one["combine_and_step_driver"] / 1e3
    p = out["local[1]"]["bytes_per_step"]["parameters_down"]
    model = {"C1_ms": compute * 1e3, "S_ms": overhead * 1e3, "c_ms_per_partition": combine * 1e3, "P_bytes": p,
             "steps_per_s": {}}
    for name, bw in BANDWIDTHS.items():
        model["steps_per_s"][name] = {n: 1.0 / (compute / n + overhead + n * combine + 2 * n * p / bw)
                                      for n in EXECUTORS}
    return model


def _table(results: list) -> str:
    lines = []
    for r in results:
        lines.append(f"### {r['case']}  ({r['parameters']:,} parameters, {r['samples']} samples, batch {r['batch']})")
        lines.append("")
        lines.append("| run | steps/s | ms/step | Spark job | compute (slowest partition) | combine + step (driver) "
                     "| bytes down/step | bytes up/step |")
        lines.append("|---|---|---|---|---|---|---|---|")
        lines.append(f"| single-process Java Trainer | {r['trainer']['steps_per_s']:.1f} | "
                     f"{1e3 / r['trainer']['steps_per_s']:.1f} | | | | 0 | 0 |")
        for k in (1, 2):
            s = r[f"local[{k}]"]
            ms = s["per_step_ms"]
            lines.append(f"| Spark local[{k}] | {s['steps_per_s']:.1f} | {ms['total']:.1f} | {ms['spark_job']:.1f} | "
                         f"{ms['compute_slowest_partition']:.1f} | {ms['combine_and_step_driver']:.2f} | "
                         f"{s['bytes_per_step']['parameters_down']:,} | {s['bytes_per_step']['gradients_up']:,} |")
        m = r["model"]
        lines.append("")
        lines.append(f"Scaling model: C1 = {m['C1_ms']:.1f} ms, S = {m['S_ms']:.1f} ms, c = {m['c_ms_per_partition']:.2f} "
                     f"ms per partition, P = {m['P_bytes']:,} bytes")
        lines.append("")
        lines.append("| N executors | " + " | ".join(str(n) for n in EXECUTORS) + " |")
        lines.append("|---|" + "---|" * len(EXECUTORS))
        for name, row in m["steps_per_s"].items():
            lines.append(f"| steps/s at {name} | " + " | ".join(f"{row[n]:.1f}" for n in EXECUTORS) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench/spark.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = [_run_case(case, samples, epochs, Path(tmp)) for case, samples, epochs in CASES]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": platform.platform(), "results": results}, indent=2))
    print(_table(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
