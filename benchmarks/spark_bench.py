"""gradbridge-spark figures: steps/s with K=1 and K=2 one-thread training tasks (K=2 with each
exchange: Gloo, the default, and the driver relay), the per-step overhead (step time minus the
slowest task's compute), bytes each task sends and receives per step, and a scaling model for N
executors at 1 and 10 Gb/s, next to the single-process Java Trainer on the same data. A benchmark,
not a test.

    PYTHONPATH=python .venv/bin/python benchmarks/spark_bench.py [--out build/bench/spark.json] [--rounds 3]

Needs `gradle assemble` (the Spark classpath file). Models and data are gradbridge bench's MLP
(32-64-64-10, batch 64, Adam) and compute-bound MLP (512-1024-512-10, batch 1024, Adam). Every JVM
runs libtorch with one intra-op and one inter-op thread (OMP_NUM_THREADS=1 too), so local[2] has one
core per task.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from gradbridge import launcher, sparkrun
from gradbridge.bench import cases as bench
from gradbridge.export import export_training_module
from gradbridge.history import History

# (bench case, samples, epochs): the first epoch is warm-up, steps/s come from the later ones
CASES = [(bench.CASES[1], 2048, 4), (bench.CASES[2], 4096, 4)]
BANDWIDTHS = {"1 Gb/s": 1e9 / 8, "10 Gb/s": 10e9 / 8}
ROUNDS = 3  # every run three times by default: the median is reported, min and max beside it (shared machine)
#: (label, K, exchange: the Spark setting spark.gradbridge.exchange; K=1 exchanges nothing)
RUNS = [("K=1", 1, "gloo"), ("K=2", 2, "gloo"), ("K=2 relay", 2, "relay")]
EXECUTORS = (1, 2, 8, 16, 64)
ONE_THREAD = ["-Dgradbridge.numThreads=1", "-Dgradbridge.numInteropThreads=1"]


def _steady_steps_per_s(history: History, steps_per_epoch: int) -> float:
    elapsed = [r.elapsed_s for r in history]
    return steps_per_epoch * (len(elapsed) - 1) / (elapsed[-1] - elapsed[0])


def _spread(values) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _load_average() -> float:
    return os.getloadavg()[0]


def _run_case(case, samples: int, epochs: int, folder: Path, rounds: int) -> dict:
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
    samples_of = {label: {"rates": [], "step": [], "compute": [], "overhead": [], "exchange": [], "optimizer": [],
                          "loads": [_load_average()], "runs": []} for label, _, _ in RUNS}
    # rounds outermost: a change of the machine's load between rounds hits every configuration alike
    for _ in range(rounds):
        for label, k, exchange in RUNS:
            got = samples_of[label]
            history, stats = folder / f"h{k}.jsonl", folder / f"s{k}.json"
            sparkrun.run(["--model", path, "--data", data, "--master", f"local[{k}]", "--epochs", epochs,
                          "--batch-size", case.batch, "--history", history, "--stats", stats, "--digests-only"],
                         timeout=1800, jvm_options=[*ONE_THREAD, f"-Dspark.gradbridge.exchange={exchange}"])
            got["loads"].append(_load_average())
            s = json.loads(stats.read_text())
            got["rates"].append(_steady_steps_per_s(History.load(history), steps_per_epoch))
            got["step"].append(1e3 * s["step_s"] / s["steps"])
            got["compute"].append(1e3 * s["compute_s"] / s["steps"])
            got["overhead"].append(1e3 * (s["step_s"] - s["compute_s"]) / s["steps"])
            got["exchange"].append(1e3 * s["exchange_s"] / s["steps"])
            got["optimizer"].append(1e3 * s["optimizer_s"] / s["steps"])
            got["runs"].append(s)
    for label, _, _ in RUNS:
        got = samples_of[label]
        s = got["runs"][-1]
        out[label] = {
            "exchange": s["exchange"],
            "load_average": _spread(got["loads"]),
            "steps_per_s": _spread(got["rates"]),
            "per_step_ms": {"step": _spread(got["step"]), "compute_slowest_task": _spread(got["compute"]),
                            "overhead": _spread(got["overhead"]),
                            # the slowest task's, so they include waiting for the slowest compute
                            "exchange": _spread(got["exchange"]), "optimizer": _spread(got["optimizer"])},
            # one barrier stage per run: its start (launch, meeting, module loads) once, and partition
            # 0's epoch ends (archive, record inputs, hand-over; the others wait at the next step)
            "run_stage_s": s["stage_s"],
            "run_load_s": s["load_s"],
            "per_epoch_end_s": s["epoch_end_s"] / epochs,
            "bytes_per_task_per_step": {"sent": s["bytes_sent"] // s["steps"],
                                        "received": s["bytes_received"] // s["steps"]},
            "parameter_bytes": s["parameter_bytes"],
        }
    history = folder / "trainer.jsonl"
    rates = []
    for _ in range(rounds):
        # the same JVM options, classpath and libtorch (this Python's) as the Spark runs
        subprocess.run(sparkrun.command(["--model", path, "--data", data, "--epochs", epochs, "--batch-size", case.batch,
                                         "--history", history, "--digests-only", "--no-progress"],
                                        jvm_options=ONE_THREAD, main=launcher.TRAIN_MAIN),
                       check=True, capture_output=True, text=True, timeout=1800)
        rates.append(_steady_steps_per_s(History.load(history), steps_per_epoch))
    out["trainer"] = {"steps_per_s": _spread(rates)}
    out["speedup_K2_over_K1"] = out["K=2"]["steps_per_s"]["median"] / out["K=1"]["steps_per_s"]["median"]
    out["speedup_K2_relay_over_K1"] = out["K=2 relay"]["steps_per_s"]["median"] / out["K=1"]["steps_per_s"]["median"]
    out["bound_K2_over_K1"] = _bound(out)
    out["model"] = _scaling_model(out)
    return out


def _bound(out: dict) -> dict:
    """The most K=2 can gain over K=1 on this machine, from this run's own figures: K=1's steady step
    (its epoch ends included) over K=2's slowest-task compute plus its optimizer step, as if the
    exchange and the epoch ends cost nothing at K=2. Both replicas run the whole optimizer step
    (every replica holds the same bits), and two tasks on this machine's cores compute slower than
    one alone, so the bound sits below 2 however fast the exchange gets."""
    k1 = 1.0 / out["K=1"]["steps_per_s"]["median"]
    bound = {}
    for label in ("K=2", "K=2 relay"):
        ms = out[label]["per_step_ms"]
        bound[label] = k1 * 1e3 / (ms["compute_slowest_task"]["median"] + ms["optimizer"]["median"])
    return bound


def _scaling_model(out: dict) -> dict:
    """Per step on N executors, each on its own machine:
        relay:  T(N) = C1/N + O_relay + E/S + 2*N*P/BW        (the driver forwards every task's 2P)
        gloo:   T(N) = C1/N + O_gloo + E/S + 2*P*(N-1)/N/BW    (task to task: all-to-all, then ring all-gather)
    C1: the whole batch's compute in one task (K=1); O: the per-step overhead measured at K=2 with
    that exchange (step minus the slowest task's compute: the exchange, the combine and the optimizer
    step); E/S: partition 0's epoch end (saving its archive, the record's inputs, the hand-over to
    the driver, while the others wait) over the epoch's S steps; P: the gradient bytes. The run's one
    stage start (launch, meeting, module loads: R) is paid once per run, not per step, and is listed
    apart. Ideal compute scaling and an O that does not grow with N are optimistic."""
    c1 = out["K=1"]["per_step_ms"]["compute_slowest_task"]["median"] / 1e3
    p = out["K=1"]["parameter_bytes"]
    model = {"C1_ms": c1 * 1e3, "P_bytes": p}
    for kind, label in (("relay", "K=2 relay"), ("gloo", "K=2")):
        run = out[label]
        overhead = run["per_step_ms"]["overhead"]["median"] / 1e3
        per_step_epoch = run["per_epoch_end_s"] / out["steps_per_epoch"]
        steps = out["steps_per_epoch"] * out["epochs"]
        start = max(0.0, run["run_stage_s"] - steps * run["per_step_ms"]["step"]["median"] / 1e3
                    - out["epochs"] * run["per_epoch_end_s"])
        wire = (lambda n: 2 * n * p) if kind == "relay" else (lambda n: 2 * p * (n - 1) / n)
        model[kind] = {"O_ms": overhead * 1e3, "E_per_step_ms": per_step_epoch * 1e3, "R_run_s": start,
                       "steps_per_s": {}}
        for name, bw in BANDWIDTHS.items():
            model[kind]["steps_per_s"][name] = {
                n: 1.0 / (c1 / n + overhead + per_step_epoch + (wire(n) / bw if n > 1 else 0)) for n in EXECUTORS}
    return model


def _fmt(spread: dict, digits: int = 1) -> str:
    return f"{spread['median']:.{digits}f} [{spread['min']:.{digits}f}-{spread['max']:.{digits}f}]"


def _table(results: list) -> str:
    lines = []
    for r in results:
        lines.append(f"### {r['case']}  ({r['parameters']:,} parameters, {r['samples']} samples, batch {r['batch']})")
        lines.append("")
        lines.append("| run | steps/s | ms/step | compute (slowest task) | overhead | exchange | optimizer "
                     "| bytes sent/task/step | bytes received/task/step |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        lines.append(f"| single-process Java Trainer, 1 thread | {_fmt(r['trainer']['steps_per_s'])} | | | | | | 0 | 0 |")
        for label, k, _ in RUNS:
            s = r[label]
            ms = s["per_step_ms"]
            what = "exchanges nothing" if k == 1 else s["exchange"]
            lines.append(f"| Spark local[{k}], {k} task(s) of 1 thread, {what} (load {_fmt(s['load_average'])}) | "
                         f"{_fmt(s['steps_per_s'])} | "
                         f"{_fmt(ms['step'], 2)} | {_fmt(ms['compute_slowest_task'], 2)} | {_fmt(ms['overhead'], 2)} | "
                         f"{_fmt(ms['exchange'], 2)} | {_fmt(ms['optimizer'], 2)} | "
                         f"{s['bytes_per_task_per_step']['sent']:,} | {s['bytes_per_task_per_step']['received']:,} |")
        m = r["model"]
        lines.append("")
        lines.append(f"K=2 over K=1: {r['speedup_K2_over_K1']:.2f}x with Gloo, {r['speedup_K2_relay_over_K1']:.2f}x "
                     f"with the relay; at most {r['bound_K2_over_K1']['K=2']:.2f}x / "
                     f"{r['bound_K2_over_K1']['K=2 relay']:.2f}x with a free exchange and epoch end. "
                     f"Scaling model: C1 = {m['C1_ms']:.1f} ms, P = {m['P_bytes']:,} bytes; "
                     f"Gloo O = {m['gloo']['O_ms']:.2f} ms, E/S = {m['gloo']['E_per_step_ms']:.1f} ms, "
                     f"R = {m['gloo']['R_run_s']:.2f} s per run; relay O = {m['relay']['O_ms']:.2f} ms, "
                     f"E/S = {m['relay']['E_per_step_ms']:.1f} ms, R = {m['relay']['R_run_s']:.2f} s per run")
        lines.append("")
        lines.append("| steps/s, N executors | " + " | ".join(str(n) for n in EXECUTORS) + " |")
        lines.append("|---|" + "---|" * len(EXECUTORS))
        for kind in ("relay", "gloo"):
            for name, row in m[kind]["steps_per_s"].items():
                lines.append(f"| {kind}, {name} | " + " | ".join(f"{row[n]:.1f}" for n in EXECUTORS) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench/spark.json"))
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="runs of each configuration (median, min-max)")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        results = [_run_case(case, samples, epochs, Path(tmp), args.rounds) for case, samples, epochs in CASES]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": platform.platform(), "results": results}, indent=2))
    print(_table(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
