"""`gradbridge online-bench`: runs the online learner's benchmark (``gradbridge.bench.online``) and
prints its figures: predict latency with training off and on, learning throughput against batch
training, the learner's time per phase, and the goals."""

from __future__ import annotations

import os

import numpy as np

from ..bench.online import CLASSES, EVENTS, FEATURES, FEEDERS, JAVA_VARIANTS, measure
from ..bench.stats import ratio_ci, verdict

#: The online learner's speed targets: predict p50 no slower than the Python service, predict p99
#: under this with training on, learning at least these fractions of the fused ``train_epoch``.
P99_LIMIT_US = 1000.0
LEARNING_TARGETS = (("online_never", "fsync never", 0.8), ("online_always", "fsync always", 0.5))


def _spread(values, digits: int = 2) -> str:
    return f"{float(np.median(values)):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def goals(figures) -> list:
    """The targets judged on one run: latency pooled over the rounds' samples (the p99 of every
    call timed, rounds x --predictions; each round's own p99 beside it, to show how often a round
    alone misses); throughput as the median of the per-round ratios to the fused epoch with a 95%
    bootstrap interval over rounds (met when the whole interval is at or above the target, missed
    when all of it is below)."""
    java, python = figures["java"], figures["python"]
    rounds = len(java["predict_by_round"]["training_p99_us"])
    lines = ["goals (java, this machine):"]
    for when, key in (("training off", "predict_idle_p50_us"), ("training on", "predict_training_p50_us")):
        j, p = java[key], python[key]
        lines.append(f"  predict p50 {when} no slower than python: {'met' if j <= p else 'NOT met'} "
                     f"({j:.0f} vs {p:.0f} us, {j / p:.2f}x; {rounds} rounds pooled)")
    p99s = java["predict_by_round"]["training_p99_us"]
    under = sum(v < P99_LIMIT_US for v in p99s)
    pooled = java["predict_training_p99_us"]
    lines.append(f"  predict p99 with training on under {P99_LIMIT_US:.0f} us: "
                 f"{'met' if pooled < P99_LIMIT_US else 'NOT met'} ({pooled:.0f} us, {rounds} rounds pooled; "
                 f"python {python['predict_training_p99_us']:.0f}; by round {_spread(p99s, 0)} us, "
                 f"under in {under} of {rounds} rounds)")
    by_round = java["events_per_s_by_round"]
    fused = by_round["fused_epoch"]
    for key, label, target in LEARNING_TARGETS:
        if len(fused) < 2:
            lines.append(f"  learning {label} >= {target}x fused: needs 2 rounds or more")
            continue
        # as times: online/fused <= 1/target, the interval inverted back into a rate ratio
        times = ratio_ci(fused, by_round[key])
        low, high = (1 / times["ci95"][1], 1 / times["ci95"][0])
        judged = verdict(times["ci95"], 1 / target)
        lines.append(f"  learning {label} >= {target}x fused: {'NOT met' if judged == 'missed' else judged} "
                     f"({1 / times['ratio']:.2f}x [{low:.2f}, {high:.2f}])")
    load = figures.get("load_average")
    if load:
        lines.append(f"  load average (1 min) at start / end: {load['start'][0]:.2f} / {load['end'][0]:.2f} "
                     f"on {os.cpu_count()} CPUs")
    return lines


def run(events: int = EVENTS, batch: int = 32, predictions: int = 2000, predict_threads: int = 2,
        feedback_threads: int = 2, publish_every: int = 1, rounds: int = 5, out_dir: str = "build/online-bench",
        feeders: int = FEEDERS, out=print) -> int:
    figures = measure(events, batch, predictions, predict_threads, feedback_threads, publish_every, rounds, out_dir,
                      feeders)
    java, python, command = figures["java"], figures["python"], figures["command"]
    out(f"MLP {FEATURES}-64-{CLASSES}, Adam, micro-batch {batch}, {events} events, {predictions} one-row predictions "
        f"from {predict_threads} threads, {feedback_threads} feedback threads; java publishes a version every "
        f"{publish_every} updates")
    out(f"command: {command}")
    out("")
    out(f"predict latency, training off / on ({rounds} rounds of {predictions} calls each side, pooled):")
    out(f"{'':<22} {'p50 off/on (us)':>20} {'p99 off/on (us)':>20} {'p50 x':>6} {'p99 x':>6}")
    for label, f in (("java OnlineLearner", java), ("python lock + thread", python)):
        p50 = f["predict_training_p50_us"] / f["predict_idle_p50_us"]
        p99 = f["predict_training_p99_us"] / f["predict_idle_p99_us"]
        out(f"{label:<22} {f['predict_idle_p50_us']:>9.0f}/{f['predict_training_p50_us']:<10.0f} "
            f"{f['predict_idle_p99_us']:>9.0f}/{f['predict_training_p99_us']:<10.0f} {p50:>6.2f} {p99:>6.2f}")
    for label, f in (("java", java), ("python", python)):
        by = f["predict_by_round"]
        out(f"  {label} p99 training on, by round (us): {' '.join(f'{v:.0f}' for v in by['training_p99_us'])}; "
            f"updates during them: {' '.join(str(u) for u in f['updates_during_predictions'])}")
    out("")
    by_round = java["events_per_s_by_round"]
    fused, step = by_round["fused_epoch"], by_round["trainer_step"]
    out(f"learning throughput, java: events/s, median [min-max] of {rounds} interleaved rounds on the same events "
        f"(one compute thread each; the OnlineLearner fed by {feeders} concurrent clients, each waiting for its "
        f"acknowledgement), and per-round ratios:")
    out(f"{'java':<30} {'events/s':>24} {'/ fused epoch':>20} {'/ Trainer step':>20}")
    for key, label, _ in JAVA_VARIANTS:
        values = by_round[key]
        vs_fused = [v / f for v, f in zip(values, fused)]
        vs_step = [v / s for v, s in zip(values, step)]
        out(f"{label:<30} {float(np.median(values)):>9.0f} [{min(values):.0f}-{max(values):.0f}]"
            f"{_spread(vs_fused):>22} {_spread(vs_step):>20}")
    py = python["events_per_s_by_round"]
    py_vs_loop = [o / p for o, p in zip(py["online"], py["loop"])]
    out(f"{'python lock + thread':<30} {python['online_events_per_s']:>9.0f} [{min(py['online']):.0f}-"
        f"{max(py['online']):.0f}]{'':>20} {_spread(py_vs_loop):>20}  (/ its loop of optimizer steps, "
        f"{python['fused_events_per_s']:.0f} ev/s)")
    out("")
    phases = java["phase_us_per_micro_batch"]
    out("java OnlineLearner, us per micro-batch by phase (training thread; learn_* on the feeding thread):")
    names = [k for k in phases["online_never"] if k != "wall"]
    out(f"{'':<16}" + "".join(f"{k:>15}" for k in ("fsync never", "fsync always")))
    for name in ["wall"] + names:
        out(f"{name:<16}" + "".join(f"{phases[k][name]:>15.1f}" for k in ("online_never", "online_always")))
    out("")
    for line in goals(figures):
        out(line)
    out(f"wrote {figures['path']}")
    return 0
