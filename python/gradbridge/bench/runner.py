"""`gradbridge bench`'s one entry point: every benchmark on this machine, into bench.json and bench.png."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Sequence

import numpy as np
import torch

from .._runtime import devtree as _devtree, jdk
from .. import jvm
from .._runtime.files import atomic_path
from . import memory as bench_memory
from .cases import CASES, _data, _export, bench_startup, bench_steps, bench_transfer, breakdown
from .report import answers, targets, write_chart
from .stats import BOOTSTRAP_RESAMPLES, CONFIDENCE
from .workers import JavaSettings, native_binary

def _git_commit() -> str | None:
    try:
        root = _devtree.require_root("gradbridge bench")
        result = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return result.stdout.strip() + ("+changes" if dirty else "") if result.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _machine(quick: bool, rounds: int, threads: int) -> Dict[str, Any]:
    java_version = subprocess.run([jdk.checked_java(), "-version"], capture_output=True, text=True).stderr
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "platform": platform.platform(),
            "cpus": os.cpu_count(), "cpu_model": _cpu_model(), "torch": torch.__version__,
            "torch_threads": threads, "torch_interop_threads": torch.get_num_interop_threads(),
            "java": java_version.splitlines()[0] if java_version else None, "python": platform.python_version(),
            "commit": _git_commit(), "quick": quick, "rounds": rounds, "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
            "confidence": CONFIDENCE, "load_average_at_start": os.getloadavg()}


def _cpu_model() -> str | None:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return None


def run(*, quick: bool, out_dir: str | os.PathLike, rounds: int | None = None, cases: Sequence[str] = (),
        only: Sequence[str] = (), steps_only: bool = False, java_settings: JavaSettings | None = None,
        threads: int | None = None, memory_steps: int | None = None, out: Callable[[str], None] = print) -> Dict:
    """Run every benchmark (``out`` gets the progress lines); write bench.json and bench.png into
    ``out_dir``; return the results (``report.format_tables`` prints them).

    ``cases``/``only`` narrow the step benchmark to some models / variants (keys of CASES and
    VARIANTS); ``steps_only`` skips transfer, memory and start-up; ``java_settings`` changes how
    the own-JVM variants start (options, environment, CPUs); ``threads`` sets every variant's
    intra-op threads (default: torch's); ``memory_steps`` the length of each memory run
    (default bench_memory.DEFAULT_STEPS, --quick bench_memory.QUICK_STEPS).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if threads:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    rounds = rounds or (3 if quick else 15)
    java_settings = java_settings or JavaSettings()
    jvm.start()
    # compiled once per checkout (rebuilt when the source is newer), whatever --out-dir says
    binary = native_binary(_devtree.require_root("gradbridge bench") / "build" / "bench-native")
    started = time.perf_counter()
    results: Dict[str, Any] = {"machine": _machine(quick, rounds, threads)}
    if java_settings.options or java_settings.env or java_settings.cpus:
        results["machine"]["java_settings"] = {"options": java_settings.options, "env": java_settings.env,
                                               "cpus": java_settings.cpus}
    selected = [case for case in CASES if not cases or case.key in cases]
    results["steps"] = []
    for case in selected:
        out(f"{case.name}: {rounds} rounds")
        results["steps"].append(bench_steps(case, out_dir, binary, rounds=rounds, threads=threads,
                                            calls=max(2, case.calls // (10 if quick else 1)),
                                            warmup_s=0.2 if quick else 2.0, java=java_settings, only=only,
                                            out=None if quick else out))
    if not steps_only:
        model, path = _export(CASES[0], out_dir)
        xb, yb = _data(CASES[0], CASES[0].batch)
        np.savez(out_dir / "breakdown.npz", x=xb, y=yb)
        results["breakdown"] = breakdown(path, out_dir / "breakdown.npz", rounds, 200 if quick else 2000)
        results["transfer"] = bench_transfer(min(rounds, 7), 16 if quick else 256)  # 256 MiB copies: few rounds
        results["memory"] = bench_memory.run_all(memory_steps or (bench_memory.QUICK_STEPS if quick
                                                                  else bench_memory.DEFAULT_STEPS))
        results["startup"] = bench_startup(_export(CASES[0], out_dir)[1], with_gradle=not quick)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    results["machine"]["seconds"] = time.perf_counter() - started
    results["targets"] = targets(results)
    results["answers"] = answers(results)
    with atomic_path(out_dir / "bench.json") as tmp:
        tmp.write_text(json.dumps(results, indent=2) + "\n")
    if results["steps"]:  # a chart of the step benchmark
        with atomic_path(out_dir / "bench.png") as tmp:
            write_chart(results, tmp)
    return results
