"""`gradbridge bench`'s verdicts and output: the targets and answers judged on the intervals, the tables
it prints and the chart it draws."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import numpy as np

from . import memory as bench_memory
from .cases import IN_PROCESS, PROTOCOL3, REAL_MODELS, VARIANTS
from .stats import CANNOT_TELL, MET, MISSED, compare, verdict

def _ratio_target(text: str, case: Dict, key: str, base: str, limit: float) -> Dict | None:
    """A target "variant key of case <= limit x variant base", judged on its interval."""
    variant = case["variants"].get(key)
    if variant is None or base not in case["variants"]:
        return None
    ratio = variant[{"a": "vs_a", "e": "vs_e", "e'": "vs_e_fused"}[base]]
    return {"target": f"{text}: {case['case']}", "limit": limit, "value": ratio["ratio"], "ci95": ratio["ci95"],
            "verdict": verdict(ratio["ci95"], limit)}


def targets(results: Dict) -> List[Dict]:
    """The issues' targets, each with the figures it was judged on and its verdict."""
    steps = {case["key"]: case for case in results["steps"]}
    found: List[Dict | None] = []
    # The native layer's targets: per call within 1.1x of the C++ loop, fused within 1.05x.
    for key in ("seed", "mlp"):
        if key in steps:
            found.append(_ratio_target("Java train_step (c) <= 1.1x native train_step (e)", steps[key], "c", "e", 1.1))
    for key in ("seed", "mlp", "big"):
        if key in steps:
            found.append(_ratio_target("Java fused (d) <= 1.05x native fused loop (e')", steps[key], "d", "e'", 1.05))
    for key in ("seed", "mlp"):
        if key in steps:
            found.append(_ratio_target("Java train_step (c) <= 0.7x eager Python (a)", steps[key], "c", "a", 0.7))
    if "big" in steps:
        found.append(_ratio_target("Java train_step (c) in its own JVM within 3% of eager Python (a)",
                                   steps["big"], "c", "a", 1.03))
    # Real model shapes: Java's fused epoch at most eager's time, in this process and in its own JVM.
    for key in REAL_MODELS:
        if key in steps:
            found.append(_ratio_target("Java fused (d) <= 1.0x eager Python (a)", steps[key], "d", "a", 1.0))
            found.append(_ratio_target("Java fused in Python (d*) <= 1.0x eager Python (a)", steps[key], "d*", "a", 1.0))
    # Protocol 3 (issue 33): the same, the module exported in format='export', beside TorchScript's (d), (d*)
    for key in PROTOCOL3:
        if key in steps:
            found.append(_ratio_target("Java fused, protocol 3 (d3) <= 1.0x eager Python (a)", steps[key], "d3", "a",
                                       1.0))
            found.append(_ratio_target("Java fused, protocol 3, in Python (d3*) <= 1.0x eager Python (a)", steps[key],
                                       "d3*", "a", 1.0))
    if "transfer" in results:
        speed = results["transfer"]["one_copy_vs_numpy_copy_speed"]
        # ">= 0.5x numpy's speed" as "numpy's speed / ours <= 2"
        ci = [1 / speed["ci95"][1], 1 / speed["ci95"][0]]
        found.append({"target": "transfer with one copy >= 0.5x numpy's allocating copy (as numpy/ours <= 2)",
                      "limit": 2.0, "value": 1 / speed["ratio"], "ci95": ci, "verdict": verdict(ci, 2.0)})
    for memory in results.get("memory", {}).values():
        slope, stderr = memory["slope_bytes_per_step"], memory["slope_stderr"]
        found.append({"target": f"resident memory reaches a plateau after warm-up: {memory['surface']} "
                                f"(last {bench_memory.WINDOW:.0%} of {memory['steps']:,} steps)",
                      "limit": bench_memory.FLAT_BYTES_PER_STEP, "value": slope,
                      "ci95": [slope - 2 * stderr, slope + 2 * stderr],
                      "verdict": {bench_memory.PLATEAU: MET, bench_memory.LEAK: MISSED}.get(memory["verdict"],
                                                                                      CANNOT_TELL)})
    return [target for target in found if target is not None]


def answers(results: Dict) -> List[Dict]:
    """The questions the benchmark answers with its intervals (Java in its own process against eager Python)."""
    steps = {case["key"]: case for case in results["steps"]}
    found = []
    big = steps.get("big")
    if big:
        for key, text in (("c", "Java train_step in its own JVM"), ("e", "native C++ train_step in its own process"),
                          ("b", "Python's scripted train_step"), ("c*", "Java train_step inside Python (JPype)")):
            if key in big["variants"] and "vs_a" in big["variants"][key]:
                ratio = big["variants"][key]["vs_a"]
                found.append({"question": f"compute-bound MLP: is {text} slower than eager Python?",
                              "ratio": ratio["ratio"], "ci95": ratio["ci95"], "answer": compare(ratio["ci95"])})
    return found


def _step_table(case: Dict) -> List[str]:
    """One case's lines: each variant's time per training step with its ratios and per-step counters, then
    its CPU time per step."""
    lines = ["", f"{case['case']} ({case['parameters']:,} parameters): time per training step, "
                 f"{case['rounds']} rounds (ratios: median of per-round ratios [95% bootstrap interval])",
             f"  {'variant':<41} {'median':>10} {'min':>10}  {'vs (a)':<20} {'vs (e)':<20} "
             f"{'vs (e)' + chr(39):<20} {'faults':>7} {'ctxsw':>6} {'cpu':>5}"]
    for key, label in {**VARIANTS, **IN_PROCESS}.items():
        v = case["variants"].get(key)
        if v is None:
            continue
        per = v["per_step"]
        cpu = per.get("cpu_seconds", float("nan")) / v["median_s"]
        switches = per.get("voluntary_switches", float("nan")) + per.get("involuntary_switches", float("nan"))
        lines.append(f"  {'(' + key + ')':<5}{label:<36} {_us(v['median_s']):>10} {_us(v['min_s']):>10}  "
                     f"{_ci(v.get('vs_a')):<20} {_ci(v.get('vs_e')):<20} {_ci(v.get('vs_e_fused')):<20} "
                     f"{per.get('minor_faults', float('nan')):>7.1f} {switches:>6.1f} {cpu:>5.2f}")
    if "protocol3_refused" in case:
        lines.append(f"  (d3), (d3*): format='export' refused the model: {case['protocol3_refused']}")
    lines.append("  (faults: minor page faults per step; ctxsw: context switches per step; cpu: CPU seconds "
                 "per wall second, all threads of the process)")
    lines.append("  CPU time per step (all threads of the process), ratios as above:")
    for key, label in {**VARIANTS, **IN_PROCESS}.items():
        v = case["variants"].get(key)
        if v is None or "cpu_seconds" not in v["per_step"]:
            continue
        lines.append(f"  {'(' + key + ')':<5}{label:<36} {_us(v['per_step']['cpu_seconds']):>10} {'':>10}  "
                     f"{_ci(v.get('cpu_vs_a')):<20} {_ci(v.get('cpu_vs_e')):<20} {_ci(v.get('cpu_vs_e_fused')):<20}")
    return lines


def format_tables(results: Dict) -> List[str]:
    machine = results["machine"]
    lines = [f"gradbridge bench ({'quick' if machine['quick'] else 'full'}): {machine['cpus']} CPUs, torch "
             f"{machine['torch']}, {machine['torch_threads']} intra-op threads, {machine['rounds']} rounds; "
             f"load average {machine['load_average_at_start'][0]:.2f} at start, "
             f"{machine['load_average_at_end'][0]:.2f} at end"]
    for case in results["steps"]:
        lines += _step_table(case)
    if "breakdown" in results:
        parts = results["breakdown"]
        lines += ["", f"one Java train_step on the seed model, layer by layer ({parts['calls_per_block']} calls per "
                      f"block, interleaved in one JVM; ratios to the bare call [95% interval])"]
        labels = {"bare": "bare native call (IValues made once)",
                  "train_step": "TrainingModule.trainStep (now)"}
        for key, label in labels.items():
            ratio = parts["vs_bare"].get(key)
            lines.append(f"  {label:<46} {_us(parts['median_s'][key]):>10}  {_ci(ratio) if ratio else ''}")
    if "transfer" in results:
        transfer = results["transfer"]
        lines += ["", f"transfer of {transfer['bytes'] / 2**20:.0f} MiB float32 (numpy -> libtorch tensor in the JVM),"
                      f" medians of {transfer['rounds']} rounds"]
        lines += [f"  {name:<44} {seconds * 1e3:>9.2f} ms" + (f" {transfer['gb_per_s'][name]:>8.2f} GB/s"
                                                              if name in transfer["gb_per_s"] else "")
                  for name, seconds in transfer["seconds"].items()]
    if "memory" in results:
        lines += ["", "resident memory (MLP 32-64-64-10): the last window's slope against the one before"]
        lines += [f"  {memory['surface']:<42} {memory['steps']:>9,} steps: {bench_memory.describe(memory)}"
                  for memory in results["memory"].values()]
    if "startup" in results:
        lines += ["", "start-up (seconds)"] + [f"  {name:<30} {seconds:>8.3f}" if isinstance(seconds, float)
                                               else f"  {name:<30} {seconds}"
                                               for name, seconds in results["startup"].items()]
    lines += ["", "targets (met: the whole 95% interval meets it; missed: the whole interval misses it)"]
    lines += [f"  [{t['verdict']}] {t['target']}: {t['value']:.3g} [{t['ci95'][0]:.3g}, {t['ci95'][1]:.3g}]"
              for t in results["targets"]]
    if any(t["verdict"] == CANNOT_TELL for t in results["targets"]):
        lines.append("  (cannot tell: raise --rounds, or run on a quieter machine)")
    if results.get("answers"):
        lines += ["", "answers"] + [f"  {a['question']} {a['answer']}: {a['ratio']:.3f}x eager Python "
                                    f"[{a['ci95'][0]:.3f}, {a['ci95'][1]:.3f}]" for a in results["answers"]]
    return lines


def _ci(ratio: Dict | None) -> str:
    if not ratio:
        return "-"
    return f"{ratio['ratio']:.2f} [{ratio['ci95'][0]:.2f},{ratio['ci95'][1]:.2f}]"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def write_chart(results: Dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["steps"]
    if not cases:
        return
    figure, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4.5), squeeze=False)
    colors = ["tab:blue", "tab:cyan", "tab:orange", "tab:red", "tab:gray", "black", "tab:purple"]
    palette = dict(zip(VARIANTS, colors))
    for ax, case in zip(axes[0], cases):
        keys = [k for k in VARIANTS if k in case["variants"]]
        rounds = [np.asarray(case["variants"][k]["rounds_s"]) * 1e6 for k in keys]
        medians = [float(np.median(r)) for r in rounds]
        spread = [[m - np.percentile(r, 25) for m, r in zip(medians, rounds)],
                  [np.percentile(r, 75) - m for m, r in zip(medians, rounds)]]
        bars = ax.bar([f"({k})" for k in keys], medians, yerr=spread, capsize=3, color=[palette[k] for k in keys])
        for bar, key in zip(bars, keys):
            ratio = case["variants"][key].get("vs_a")
            if ratio:
                ax.annotate(f"{ratio['ratio']:.2f}x\n[{ratio['ci95'][0]:.2f},{ratio['ci95'][1]:.2f}]",
                            (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                            fontsize=7)
        ax.set_title(case["case"], fontsize=9, wrap=True)
        ax.set_ylabel("median time per step (us); bars: rounds' quartiles")
    figure.legend([plt.Rectangle((0, 0), 1, 1, color=c) for c in palette.values()],
                  [f"({k}) {v}" for k, v in VARIANTS.items()], loc="lower center", ncol=3, fontsize=8)
    figure.suptitle(f"gradbridge: time per training step, {results['machine']['rounds']} interleaved rounds "
                    f"(labels: ratio to eager PyTorch [95% interval])")
    figure.tight_layout(rect=(0, 0.1, 1, 0.95))
    figure.savefig(path, dpi=110, format="png")  # path may be a temp file's: no extension to go by
    plt.close(figure)
