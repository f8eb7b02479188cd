"""`gradbridge bench`'s variants and how they are timed: workers (processes of their own that answer
``run N`` with the seconds N calls took: the JVM's StepBenchmark, benchmarks/native/train_loop.cpp),
blocks in this process, rounds in shuffled order, and what each block cost its process (/proc)."""

from __future__ import annotations

import json
import os
import platform
import random
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

import numpy as np
import torch

from .._runtime import devtree as _devtree, classpath, native_toolchain
from .._runtime.launcher import java_command
from .. import jvm

#: The native loop's source lives in the checkout (benchmarks/native): `gradbridge bench` is a
#: development command.
NATIVE_SOURCE = Path("benchmarks") / "native" / "train_loop.cpp"


# ---- what each block of calls cost the process beyond wall time ----

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_counters(pid: int | None = None) -> Dict[str, float]:
    """Page faults, context switches (all threads) and CPU seconds of a process, from /proc
    (Linux; empty elsewhere). ``pid`` None: this process."""
    base = Path("/proc") / (str(pid) if pid else "self")
    try:
        fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
        counters = {"minor_faults": float(fields[7]), "major_faults": float(fields[9]),
                    "cpu_seconds": (float(fields[11]) + float(fields[12])) / _TICK,
                    "voluntary_switches": 0.0, "involuntary_switches": 0.0}
        run_ns = 0.0
        for task in (base / "task").iterdir():
            try:  # schedstat: nanoseconds on a CPU, finer than stat's clock ticks
                run_ns += float((task / "schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                pass
            try:
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        counters["voluntary_switches"] += float(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        counters["involuntary_switches"] += float(line.split()[1])
            except OSError:  # a thread that ended meanwhile
                pass
        if run_ns:
            counters["cpu_seconds"] = run_ns / 1e9
        return counters
    except (OSError, IndexError, ValueError):
        return {}


def _process_facts(pid: int | None = None) -> Dict[str, Any]:
    """Threads and CPU placement of a process."""
    facts: Dict[str, Any] = {}
    try:
        facts["cpu_affinity"] = sorted(os.sched_getaffinity(pid or 0))
        status = (Path("/proc") / (str(pid) if pid else "self") / "status").read_text()
        facts["os_threads"] = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
    except (OSError, AttributeError, StopIteration, ValueError):
        pass
    return facts


_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME",
               "KMP_AFFINITY", "OMP_PROC_BIND", "LD_PRELOAD", "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_",
               "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES", "GRADBRIDGE_NATIVE_MALLOC_DEFAULTS",
               "JAVA_TOOL_OPTIONS", "JAVA_OPTS")


def _thread_env(env: Dict[str, str]) -> Dict[str, str]:
    return {name: env[name] for name in _THREAD_ENV if name in env}


class Worker:
    """A variant in a process of its own (the JVM's StepBenchmark, the native loop): it loads
    once, reports its settings in one JSON line, then times ``run N`` blocks on request."""

    def __init__(self, command: List[str], env: Dict[str, str] | None = None):
        self.command = command
        self.env = dict(os.environ if env is None else env)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=self.env)
        self._info: Dict[str, Any] | None = None

    @property
    def info(self) -> Dict[str, Any]:
        """The settings line the worker prints once loaded (workers start in parallel)."""
        if self._info is None:
            self._info = self._reply()
        return self._info

    def _reply(self) -> Dict[str, Any]:
        while True:
            line = self.process.stdout.readline()
            if not line:
                self.process.kill()
                raise RuntimeError(f"benchmark worker {' '.join(self.command[:1])} ended: "
                                   f"{self.process.stderr.read()[-2000:]}")
            if line.startswith("{"):
                return json.loads(line)

    def block(self, calls: int) -> float:
        self.process.stdin.write(f"run {calls}\n")
        self.process.stdin.flush()
        return float(self._reply()["seconds"])

    def close(self) -> None:
        try:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
            self.process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()


@dataclass
class Variant:
    """One way of running the training step, timed in blocks of ``calls`` calls."""

    key: str
    block: Callable[[int], float]
    calls: int  # calls per block
    steps_per_call: int
    pid: int | None  # the process it runs in (None: this one)
    environment: Dict[str, Any]


def native_binary(out_dir: Path) -> Path:
    """Compile benchmarks/native/train_loop.cpp against the wheel's libtorch (cached).

    The wheel ships TorchConfig.cmake, but the CUDA build's CMake config insists on a CUDA
    toolkit even for CPU code; the compiler flags it would produce are simple, so g++ gets them
    from torch.utils.cpp_extension directly.
    """
    from torch.utils import cpp_extension

    source = _devtree.require_root("gradbridge bench") / NATIVE_SOURCE
    # one binary per torch build: the C++ ABI changes between libtorch versions
    binary = out_dir / f"torch{torch.__version__}" / "train_loop"
    if binary.exists() and binary.stat().st_mtime > source.stat().st_mtime:
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    libs = cpp_extension.library_paths()
    standard = native_toolchain.cxx_standard(Path(cpp_extension.include_paths()[0]))
    command = ["g++", "-O2", standard, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               str(source), *[f"-I{p}" for p in cpp_extension.include_paths()],
               *[f"-L{p}" for p in libs], "-ltorch", "-ltorch_cpu", "-lc10",
               *[f"-Wl,-rpath,{p}" for p in libs], "-o", str(binary)]
    subprocess.run(command, check=True)
    return binary


def _write_native_data(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    with open(path, "wb") as out:
        out.write(np.int64(len(x)).tobytes())
        for array in (x, y):
            out.write(np.int64(array.ndim).tobytes() + np.asarray(array.shape, dtype="<i8").tobytes())
        out.write(np.int64(y.dtype == np.int64).tobytes())
        out.write(np.ascontiguousarray(x, dtype="<f4").tobytes() + np.ascontiguousarray(y).astype(y.dtype.newbyteorder("<")).tobytes())


@dataclass
class JavaSettings:
    """How the own-JVM variants start: extra JVM options and environment (the own-process
    investigation varies these one at a time), and an optional CPU list (taskset)."""

    options: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    cpus: str | None = None


def _java_worker(model: Path, data: Path, mode: str, batch: int, threads: int, settings: JavaSettings) -> Worker:
    """StepBenchmark in a JVM of its own, on the wheel's libtorch (no Python in that process)."""
    command = java_command("dev.gradbridge.bench.StepBenchmark", [model, data, mode, batch],
                           entries=classpath.resolve().entries,
                           jvm_options=["-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                                        f"-Dgradbridge.numThreads={threads}",
                                        f"-Dgradbridge.numInteropThreads={torch.get_num_interop_threads()}",
                                        *settings.options])
    if settings.cpus:
        command = ["taskset", "-c", settings.cpus, *command]
    return Worker(command, {**os.environ, **settings.env})


def _native_worker(binary: Path, model: Path, data: Path, mode: str, threads: int, batch: int) -> Worker:
    return Worker([str(binary), str(model), str(data), mode, str(threads), str(batch)])


def _worker_variant(key: str, worker: Worker, calls: int, steps_per_call: int, where: str,
                    extra_env: Dict[str, str] | None = None) -> Variant:
    environment = {"where": where, "command": worker.command, **worker.info,
                   "env": _thread_env({**(extra_env or {}), **{k: v for k, v in worker.env.items() if k in _THREAD_ENV}}),
                   **_process_facts(worker.process.pid)}
    environment.pop("ready", None)
    return Variant(key, worker.block, calls, steps_per_call, worker.process.pid, environment)


def _in_process_environment(where: str) -> Dict[str, Any]:
    return {"where": where, "intra_op_threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(), "python": platform.python_version(),
            "env": _thread_env(dict(os.environ)), **_process_facts()}


def _in_process_jvm_options() -> List[str]:
    runtime = jvm.jclass("java.lang.management.ManagementFactory").getRuntimeMXBean()
    return [str(option) for option in runtime.getInputArguments()]


def _python_block(step: Callable[[], None]) -> Callable[[int], float]:
    def block(calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            step()
        return time.perf_counter() - start
    return block


def run_rounds(variants: Sequence[Variant], rounds: int, *, warmup_s: float, seed: int = 0,
               out: Callable[[str], None] | None = None) -> Dict[str, Dict[str, List[float]]]:
    """Warm every variant up for about ``warmup_s``, then time ``rounds`` rounds: in each, every
    variant runs one block, in an order shuffled per round (so that no variant always follows
    the same one), so that load on the machine hits all alike. Returns per variant: seconds per
    step in each round, and what each block cost its process (faults, context switches, CPU)
    per step."""
    for variant in variants:
        deadline = time.perf_counter() + warmup_s
        while True:
            variant.block(variant.calls)
            if time.perf_counter() >= deadline:
                break
    shuffle = random.Random(seed)
    results: Dict[str, Dict[str, List[float]]] = {v.key: {"step_seconds": []} for v in variants}
    for done in range(rounds):
        order = list(variants)
        shuffle.shuffle(order)
        for variant in order:
            before = proc_counters(variant.pid)
            seconds = variant.block(variant.calls)
            after = proc_counters(variant.pid)
            steps = variant.calls * variant.steps_per_call
            record = results[variant.key]
            record["step_seconds"].append(seconds / steps)
            for name in after:
                record.setdefault(name + "_per_step", []).append((after[name] - before.get(name, 0.0)) / steps)
        if out:
            out(f"  round {done + 1}/{rounds} done")
    return results
