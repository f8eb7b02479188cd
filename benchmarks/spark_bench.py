"""gradbridge-spark figures: steps/s with K=1 and K=2 training tasks (K=2 with each
exchange: Gloo, the default, and the driver relay), the per-step overhead (step time minus the
slowest task's compute), bytes each task sends and receives per step, and a scaling model for N
executors at 1 and 10 Gb/s, next to the single-process Java Trainer on the same data. A benchmark,
not a test.

    PYTHONPATH=python .venv/bin/python benchmarks/spark_bench.py [--out build/bench/spark.json] [--rounds 3] [--case small]

Needs `gradle assemble` (the Spark classpath file). Models and data are gradbridge bench's MLP
(32-64-64-10, batch 64, Adam) and compute-bound MLP (512-1024-512-10, batch 1024, Adam). Each Spark
task runs libtorch on its default share of threads (spark.gradbridge.threads unset: the task's cores,
spark.task.cpus = 1, so local[2]'s two tasks one thread each), and the single-process Trainers on the
count the tasks report in --stats, so the ceiling does the tasks' work on as many threads; every JVM
has one inter-op thread.
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

from gradbridge._runtime import launcher, sparkrun
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
# the Trainers run this many times the Spark runs' epochs: two started at once then overlap in their
# steady state, not in one's JVM start and the other's epochs
TRAINER_EPOCHS = 4
INTEROP = ["-Dgradbridge.numInteropThreads=1"]


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
                          "spread": [], "phases": [], "loads": [_load_average()], "runs": []} for label, _, _ in RUNS}
    # the same work as each K=2 task (half the batch, the whole optimizer step), for two Trainers at once
    halves = []
    for q in range(2):
        halves.append(folder / f"half{q}.npz")
        np.savez(halves[-1], x=x[q::2], y=y[q::2])
    rates, pairs, threads = [], [], set()
    # rounds outermost, the Trainers in each: a change of the machine's load between rounds hits every
    # configuration alike, and each round's K=2 is judged against the ceiling measured beside it
    for _ in range(rounds):
        for label, k, exchange in RUNS:
            got = samples_of[label]
            history, stats = folder / f"h{k}.jsonl", folder / f"s{k}.json"
            sparkrun.run(["--model", path, "--data", data, "--master", f"local[{k}]", "--epochs", epochs,
                          "--batch-size", case.batch, "--history", history, "--stats", stats, "--digests-only"],
                         timeout=1800, jvm_options=[*INTEROP, f"-Dspark.gradbridge.exchange={exchange}"])
            got["loads"].append(_load_average())
            s = json.loads(stats.read_text())
            got["rates"].append(_steady_steps_per_s(History.load(history), steps_per_epoch))
            got["step"].append(1e3 * s["step_s"] / s["steps"])
            got["compute"].append(1e3 * s["compute_s"] / s["steps"])
            got["overhead"].append(1e3 * (s["step_s"] - s["compute_s"]) / s["steps"])
            got["exchange"].append(1e3 * s["exchange_s"] / s["steps"])
            got["optimizer"].append(1e3 * s["optimizer_s"] / s["steps"])
            got["spread"].append(1e3 * s["compute_spread_s"] / s["steps"])
            # per phase of the exchange, per partition: ms per step
            got["phases"].append({phase: [1e3 * t / s["steps"] for t in per_partition]
                                  for phase, per_partition in s.get("exchange_phases_s", {}).items()})
            got["runs"].append(s)
            threads.update(s["threads"])
        # the Trainers run on the tasks' threads: a ceiling on more (or fewer) threads would not be K=2's
        if len(threads) != 1:
            raise RuntimeError(f"the Spark tasks ran on different thread counts: {sorted(threads)}")
        count = next(iter(threads))
        rates.append(_trainers_at_once(path, [data], case.batch, TRAINER_EPOCHS * epochs, steps_per_epoch, folder,
                                       count)[0])
        pairs.append(min(_trainers_at_once(path, halves, case.batch // 2, TRAINER_EPOCHS * epochs, steps_per_epoch,
                                           folder, count)))
    out["threads_per_task"] = next(iter(threads))
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
                            "exchange": _spread(got["exchange"]), "optimizer": _spread(got["optimizer"]),
                            # the slowest task's compute minus the fastest's: the fastest one's wait in the exchange
                            "compute_spread": _spread(got["spread"])},
            # inside the exchange, per phase (GradientExchange.PHASES), per partition: median over rounds; a
            # collective's time includes waiting for the slower task, so the smaller partition's is the collective's own
            "exchange_phases_ms": {phase: [statistics.median(r[phase][q] for r in got["phases"])
                                           for q in range(len(got["phases"][0][phase]))]
                                   for phase in (got["phases"][0] if got["phases"] else {})},
            # one barrier stage per run: its start (launch, meeting, module loads) once, and partition
            # 0's epoch ends on its step path (the snapshot; the archive is saved off it)
            "run_stage_s": s["stage_s"],
            "run_load_s": s["load_s"],
            "per_epoch_end_s": s["epoch_end_s"] / epochs,
            "bytes_per_task_per_step": {"sent": s["bytes_sent"] // s["steps"],
                                        "received": s["bytes_received"] // s["steps"]},
            "parameter_bytes": s["parameter_bytes"],
            "one_round_bytes": s["one_round_bytes"],
        }
    out["trainer"] = {"steps_per_s": _spread(rates)}
    out["two_trainers_half_batch"] = {"steps_per_s": _spread(pairs)}
    out["speedup_K2_over_K1"] = out["K=2"]["steps_per_s"]["median"] / out["K=1"]["steps_per_s"]["median"]
    out["speedup_K2_relay_over_K1"] = out["K=2 relay"]["steps_per_s"]["median"] / out["K=1"]["steps_per_s"]["median"]
    # K=2 cannot outrun two processes that do its tasks' work with no exchange at all
    pair = out["two_trainers_half_batch"]["steps_per_s"]["median"]
    out["ceiling_K2_over_K1"] = pair / out["K=1"]["steps_per_s"]["median"]
    out["ceiling_K2_over_trainer"] = pair / out["trainer"]["steps_per_s"]["median"]
    # the target: K=2's gain over K=1 as a share of the ceiling's, (K2/K1) / (pair/K1) = K2/pair, each
    # round's K=2 against the pair measured in that round; median [min-max] over the rounds
    out["K2_share_of_ceiling"] = _spread([k2 / p for k2, p in zip(samples_of["K=2"]["rates"], pairs)])
    # what K=2 would reach with an exchange that cost nothing but the wait for the slower task: a step
    # of the slower task's compute then the optimizer (as measured in that round's K=2 run), round by round
    got = samples_of["K=2"]
    out["free_exchange_share_of_ceiling"] = _spread([1e3 / (c + o) / p for c, o, p in
                                                     zip(got["compute"], got["optimizer"], pairs)])
    out["model"] = _scaling_model(out)
    return out


def _trainers_at_once(path: Path, datas: list, batch: int, epochs: int, steps_per_epoch: int, folder: Path,
                      threads: int) -> list:
    """Steady steps/s of single-process Java Trainers, one per data file, all running at once (each
    on ``threads`` intra-op threads, as each Spark task ran; the same JVM options, classpath and
    libtorch, this Python's, as the Spark runs).

    Two at once, each on half the rows with half the batch, do what each K=2 task does (its half of
    the batch, then the whole optimizer step) with no Spark, no exchange and no epoch end: K=2 cannot
    go faster than they do on this machine's cores, so their rate over K=1's is the most K=2 can gain."""
    runs = []
    for i, data in enumerate(datas):
        history = folder / f"trainer{i}.jsonl"
        command = sparkrun.command(["--model", path, "--data", data, "--epochs", epochs, "--batch-size", batch,
                                    "--history", history, "--digests-only", "--no-progress"],
                                   jvm_options=[*INTEROP, f"-Dgradbridge.numThreads={threads}"],
                                   main=launcher.TRAIN_MAIN)
        runs.append((history, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    rates = []
    for history, process in runs:
        _, err = process.communicate(timeout=1800)
        if process.returncode != 0:
            raise RuntimeError(f"the Trainer failed: {err[-2000:]}")
        rates.append(_steady_steps_per_s(History.load(history), steps_per_epoch))
    return rates


def _scaling_model(out: dict) -> dict:
    """Per step on N executors, each on its own machine:
        relay:  T(N) = C1/N + O_relay + E/S + 2*N*P/BW        (the driver forwards every task's 2P)
        gloo:   T(N) = C1/N + O_gloo + E/S + 2*P*(N-1)/N/BW    (task to task: all-to-all, then ring all-gather)
                T(N) = C1/N + O_gloo + E/S + P*(N-1)/BW        (P*(N-1) at most oneRoundBytes: one all-gather of whole records)
    C1: the whole batch's compute in one task (K=1); O: the per-step overhead measured at K=2 with
    that exchange (step minus the slowest task's compute: the exchange, the combine and the optimizer
    step; a small gradient's O is one round's, also where a larger N would go by chunk); E/S:
    partition 0's epoch end on its step path (the snapshot; the others wait) over the epoch's S
    steps; P: the gradient bytes. The run's one
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
        if kind == "relay":
            wire = lambda n: 2 * n * p
        else:  # the exchange's own rule (GlooExchange.oneRound), with the run's setting
            one_round = run["one_round_bytes"]
            wire = lambda n: p * (n - 1) if p * (n - 1) <= one_round else 2 * p * (n - 1) / n
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
        threads = r["threads_per_task"]
        lines.append(f"| single-process Java Trainer, {threads} thread(s) | {_fmt(r['trainer']['steps_per_s'])} "
                     "| | | | | | 0 | 0 |")
        lines.append(f"| two Trainers at once, each half the rows and half the batch (the slower) | "
                     f"{_fmt(r['two_trainers_half_batch']['steps_per_s'])} | | | | | | 0 | 0 |")
        for label, k, _ in RUNS:
            s = r[label]
            ms = s["per_step_ms"]
            what = "exchanges nothing" if k == 1 else s["exchange"]
            lines.append(f"| Spark local[{k}], {k} task(s) of {threads} thread(s), {what} (load {_fmt(s['load_average'])}) | "
                         f"{_fmt(s['steps_per_s'])} | "
                         f"{_fmt(ms['step'], 2)} | {_fmt(ms['compute_slowest_task'], 2)} | {_fmt(ms['overhead'], 2)} | "
                         f"{_fmt(ms['exchange'], 2)} | {_fmt(ms['optimizer'], 2)} | "
                         f"{s['bytes_per_task_per_step']['sent']:,} | {s['bytes_per_task_per_step']['received']:,} |")
        lines.append("")
        for label, k, _ in RUNS:
            phases = r[label].get("exchange_phases_ms", {})
            if k > 1 and phases:
                lines.append(f"{label} exchange per step, ms (partition 0 / 1 / ...): " + ", ".join(
                    f"{phase} {' / '.join(f'{v:.2f}' for v in values)}" for phase, values in phases.items())
                    + f"; compute spread (slowest minus fastest task) {_fmt(r[label]['per_step_ms']['compute_spread'], 2)}")
        m = r["model"]
        lines.append("")
        lines.append(f"K=2 over K=1: {r['speedup_K2_over_K1']:.2f}x with Gloo, {r['speedup_K2_relay_over_K1']:.2f}x "
                     f"with the relay; this machine's ceiling (two Trainers at once, each half the batch) "
                     f"{r['ceiling_K2_over_K1']:.2f}x K=1 ({r['ceiling_K2_over_trainer']:.2f}x the Trainer); "
                     f"K=2 over the ceiling, round by round: {_fmt(r['K2_share_of_ceiling'], 2)} "
                     f"(with an exchange that cost nothing, only the wait for the slower task: "
                     f"{_fmt(r['free_exchange_share_of_ceiling'], 2)}). "
                     f"Scaling model: C1 = {m['C1_ms']:.1f} ms, P = {m['P_bytes']:,} bytes; "
                     f"Gloo O = {m['gloo']['O_ms']:.2f} ms, E/S = {m['gloo']['E_per_step_ms']:.1f} ms, "
                     f"R = {m['gloo']['R_run_s']:.2f} s per run; relay O = {m['relay']['O_ms']:.2f} ms, "
                     f"E/S = {m['relay']['E_per_step_ms']:.1f} ms, R = {m['relay']['R_run_s']:.2f} s per run")
        lines.append("")
        lines.append("| steps/s, N executors | " + " | ".join(str(n) for n in EXECUTORS) + " |")
        lines.append("|---|" + "---|" * len(EXECUTORS))
        for kind in ("relay", "gloo"):
            for name, row in m[kind]["steps_per_s"].items():
                lines.append(f"| {kind}, {name} | " + " | ".join(f"{row[n] if n in row else row[str(n)]:.1f}" for n in EXECUTORS) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/bench/spark.json"))
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="runs of each configuration (median, min-max)")
    parser.add_argument("--case", choices=("small", "big", "both"), default="both",
                        help="the small MLP, the 1.05M-parameter MLP, or both (the default)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        chosen = CASES if args.case == "both" else [CASES[0 if args.case == "small" else 1]]
        results = [_run_case(case, samples, epochs, Path(tmp), args.rounds) for case, samples, epochs in chosen]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": platform.platform(), "results": results}, indent=2))
    print(_table(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
