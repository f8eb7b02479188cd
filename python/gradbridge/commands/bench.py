"""`gradbridge bench`: Java-driven training against eager Python and a native libtorch loop.

One run, one machine, one table. Per training step, for each model:

  (a) eager PyTorch + torch.optim                 (b) Python calling the scripted module's train_step
  (c) Java calling train_step per batch           (d) Java calling train_epoch (one native call per epoch)
  (e) native C++ loop calling train_step          (e') native C++ loop calling train_epoch

(c) and (d) are timed by loops inside a JVM of their own (dev.gradbridge.bench.StepBenchmark),
as a Java service would run, on the pip wheel's libtorch, the same binary that (a), (b) and (e)
use; (c*) and (d*) are the same loops in this Python process through JPype. (e) is
benchmarks/native/train_loop.cpp, compiled against the pip wheel's libtorch. Every variant runs
the same .pt with the graph executor's optimizations off, autograd on, and the same intra-op
thread count.

The variants in processes of their own are *workers*: started and warmed up once, then asked
for one block of calls per round. Every variant runs one block per round, in an order shuffled
per round, so load on the machine hits all alike; a ratio between two variants is the median
of its per-round ratios with a bootstrap interval over rounds, and a target is met, missed, or
"cannot tell at this noise" when the interval straddles it (raise --rounds). Each block also
records what it cost its process: page faults, context switches and CPU seconds per step.

Also measured: numpy -> Java -> libtorch transfer, start-up, and resident memory over many Java
steps. Nothing here is asserted by tests.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

import jpype
import numpy as np
import torch
from torch import nn

from .. import _devtree, classpath, java, jdk, jvm, libtorch, native
from . import bench_memory
from ..export import export_training_module, losses, optim
from ..gradle import run_task
from ..models import LinearRegression, mlp
from .. import torchscript
from ..torchscript import plain_graph_executor

#: The native loop's source lives in the checkout (benchmarks/native): `gradbridge bench` is a
#: development command.
NATIVE_SOURCE = Path("benchmarks") / "native" / "train_loop.cpp"
VARIANTS = {
    "a": "eager PyTorch + torch.optim",
    "b": "Python -> scripted train_step",
    "c": "Java -> train_step",
    "d": "Java -> train_epoch (fused)",
    "e": "native C++ -> train_step",
    "e'": "native C++ -> train_epoch",
}
#: Java inside this Python process (JPype), for comparison: libtorch's autograd engine is then
#: the Python one, which manages the GIL around every backward pass.
IN_PROCESS = {
    "c*": "Java -> train_step, in Python (JPype)",
    "d*": "Java -> train_epoch, in Python (JPype)",
}


@dataclass
class Case:
    key: str  # --cases name
    name: str
    build: Callable[[], nn.Module]
    loss: str
    optimizer: dict
    features: int
    classes: int  # 0: regression with targets [n, 1]
    batch: int
    samples: int  # the fused epoch's size (a multiple of batch)
    calls: int  # calls per block (step variants); fused variants scale to about the same steps


CASES = [
    Case("seed", "linear regression (seed, 100 samples, full batch)", LinearRegression, "mse",
         {"name": "sgd", "lr": 0.01}, 1, 0, 100, 100, 400),
    Case("mlp", "MLP 32-64-64-10, batch 64", lambda: mlp(32, (64, 64), 10), "cross_entropy",
         {"name": "adam", "lr": 1e-3}, 32, 10, 64, 1024, 300),
    Case("big", "compute-bound MLP 512-1024-512-10 (1.05M params), batch 1024", lambda: mlp(512, (1024, 512), 10),
         "cross_entropy", {"name": "adam", "lr": 1e-4}, 512, 10, 1024, 4096, 8),
]


def _data(case: Case, n: int, seed: int = 0):
    g = np.random.default_rng(seed)
    if case.classes == 0:  # the seed's data: y = 2x + 1 + noise, x in [0, 10)
        x = (g.random((n, 1)) * 10).astype(np.float32)
        return x, (2 * x + 1 + (g.random((n, 1)) - 0.5) * 2).astype(np.float32)
    x = g.standard_normal((n, case.features)).astype(np.float32)
    return x, g.integers(0, case.classes, n).astype(np.int64)


# ---- statistics: per-round ratios, bootstrap intervals, verdicts ----

#: Bootstrap resamples per interval, and the interval's coverage.
BOOTSTRAP_RESAMPLES = 4000
CONFIDENCE = 0.95
MET, MISSED, CANNOT_TELL = "met", "missed", "cannot tell at this noise"


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float], *, seed: int = 0) -> Dict[str, Any]:
    """The ratio of two variants timed in the same rounds, with a bootstrap interval.

    Each round timed both variants back to back, so the per-round ratio cancels what drifts
    between rounds (another process starting, the CPU's clock); the estimate is the median of
    the per-round ratios, and its interval is the percentile bootstrap over rounds (rounds
    resampled with replacement, ``BOOTSTRAP_RESAMPLES`` times).
    """
    a = np.asarray(numerator, dtype=np.float64)
    b = np.asarray(denominator, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError("ratio_ci needs two equally long series of at least 2 rounds")
    ratios = a / b
    resampled = np.random.default_rng(seed).integers(0, len(ratios), (BOOTSTRAP_RESAMPLES, len(ratios)))
    medians = np.median(ratios[resampled], axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return {"ratio": float(np.median(ratios)), "ci95": [float(low), float(high)], "rounds": len(ratios)}


def verdict(ci: Sequence[float], limit: float) -> str:
    """A target "ratio <= limit": met when the whole interval is at or below it, missed when
    the whole interval is above it, and otherwise the rounds cannot tell."""
    low, high = ci
    if high <= limit:
        return MET
    if low > limit:
        return MISSED
    return CANNOT_TELL


def compare(ci: Sequence[float]) -> str:
    """Which way a ratio's interval points: slower (> 1), faster (< 1), or cannot tell."""
    low, high = ci
    if low > 1:
        return "slower"
    if high < 1:
        return "faster"
    return CANNOT_TELL


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
    standard = native._cxx_standard(Path(cpp_extension.include_paths()[0]))
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
    command = [jdk.checked_java(), *libtorch.java_options(), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               f"-Dgradbridge.numThreads={threads}",
               f"-Dgradbridge.numInteropThreads={torch.get_num_interop_threads()}",
               *settings.options,
               "-cp", os.pathsep.join(classpath.resolve().entries), "dev.gradbridge.bench.StepBenchmark",
               str(model), str(data), mode, str(batch)]
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


def _export(case: Case, out_dir: Path):
    """The case's model (seeded) and its exported training module."""
    torch.manual_seed(0)
    model = case.build()
    xb, yb = _data(case, case.batch)
    path = export_training_module(model, case.loss, case.optimizer, out_dir / f"{case.key}-{case.batch}.pt",
                                  example_inputs=(torch.from_numpy(xb), torch.from_numpy(yb)))
    return model, path


def bench_steps(case: Case, out_dir: Path, binary: Path, *, rounds: int, calls: int, threads: int,
                warmup_s: float, java: JavaSettings, only: Sequence[str] = (),
                out: Callable[[str], None] | None = None) -> Dict:
    model, path = _export(case, out_dir)
    xb, yb = _data(case, case.batch)
    x, y = _data(case, case.samples, seed=1)
    batches = case.samples // case.batch
    fused_calls = max(1, calls // batches)
    wanted = lambda key: not only or key in only  # noqa: E731

    eager = copy.deepcopy(model)  # (a) eager PyTorch + torch.optim
    optimizer = optim.torch_optimizer(case.optimizer, eager.parameters())
    loss_fn = losses.build({"name": case.loss})
    txb, tyb = torch.from_numpy(xb), torch.from_numpy(yb)

    def eager_step():
        optimizer.zero_grad()
        loss_fn(eager(txb), tyb).backward()
        optimizer.step()

    scripted = torchscript.load(str(path))  # (b) Python calling the scripted module
    step_npz, epoch_npz = out_dir / "batch.npz", out_dir / "epoch.npz"
    np.savez(step_npz, x=xb, y=yb)
    np.savez(epoch_npz, x=x, y=y)
    step_bin, epoch_bin = out_dir / "batch.bin", out_dir / "epoch.bin"
    _write_native_data(step_bin, xb, yb)
    _write_native_data(epoch_bin, x, y)

    here = _in_process_environment("this Python process")
    variants: List[Variant] = []
    workers: List[Worker] = []
    module = None
    try:
        if wanted("a"):
            variants.append(Variant("a", _python_block(eager_step), calls, 1, None, here))
        if wanted("b"):
            variants.append(Variant("b", _python_block(lambda: scripted.train_step(txb, tyb)), calls, 1, None, here))
        # (c), (d): a JVM of their own; (e), (e'): the native loop; each a worker process
        own_jvm = f"a JVM of its own{' on CPUs ' + java.cpus if java.cpus else ''}"
        started = []  # all workers load at once; each is asked for its settings line afterwards
        for key, data, mode, n in (("c", step_npz, "step", calls), ("d", epoch_npz, "fused", fused_calls)):
            if wanted(key):
                workers.append(_java_worker(path, data, mode, case.batch, threads, java))
                started.append((key, workers[-1], n, 1 if mode == "step" else batches, own_jvm, java.env))
        for key, data, mode, n in (("e", step_bin, "step", calls), ("e'", epoch_bin, "fused", fused_calls)):
            if wanted(key):
                workers.append(_native_worker(binary, path, data, mode, threads, case.batch))
                started.append((key, workers[-1], n, 1 if mode == "step" else batches, "a native process", None))
        variants += [_worker_variant(*worker) for worker in started]
        if wanted("c*") or wanted("d*"):  # loops and clock inside the JVM, in this process (JPype)
            Bench = jvm.jclass("dev.gradbridge.bench.StepBenchmark")
            module = jvm.load_module(path)
            jxb, jyb = jvm.to_tensor(xb), jvm.to_tensor(yb)
            jx, jy = jvm.to_tensor(x), jvm.to_tensor(y)
            perm = jvm.to_tensor(np.arange(case.samples, dtype=np.int64))
            # Starting the engine here tunes this process's allocator too (dev.gradbridge.NativeMemory)
            here["native_memory"] = str(jvm.jclass("dev.gradbridge.NativeMemory").describe())
            in_jvm = {**here, "where": "this Python process (JPype)", "jvm_options": _in_process_jvm_options()}
            if wanted("c*"):
                variants.append(Variant("c*", lambda n: float(Bench.trainStep(module, jxb, jyb, 0, 1, n)[0]),
                                        calls, 1, None, in_jvm))
            if wanted("d*"):
                variants.append(Variant("d*", lambda n: float(Bench.trainEpoch(module, jx, jy, perm, case.batch,
                                                                               0, 1, n)[0]),
                                        fused_calls, batches, None, in_jvm))
        load = {"before": os.getloadavg()}
        with jvm.java_errors(), plain_graph_executor():
            timings = run_rounds(variants, rounds, warmup_s=warmup_s, out=out)
        load["after"] = os.getloadavg()
    finally:
        for worker in workers:
            worker.close()
        if module is not None:
            module.close()
    results = {}
    for variant in variants:
        record = timings[variant.key]
        per_step = record["step_seconds"]
        results[variant.key] = {
            "label": {**VARIANTS, **IN_PROCESS}[variant.key], "calls_per_block": variant.calls,
            "steps_per_block": variant.calls * variant.steps_per_call,
            "median_s": statistics.median(per_step), "min_s": min(per_step), "rounds_s": per_step,
            "per_step": {name[:-len("_per_step")]: statistics.median(values)
                         for name, values in record.items() if name.endswith("_per_step")},
            "environment": variant.environment}
    for key, value in results.items():
        for base, name in (("a", "vs_a"), ("e", "vs_e"), ("e'", "vs_e_fused")):
            if base in results:
                value[name] = ratio_ci(timings[key]["step_seconds"], timings[base]["step_seconds"])
                # The same ratio in CPU time (all threads): what a step costs, less sensitive to
                # other processes than wall time (evidence when the machine is busy).
                cpu, base_cpu = timings[key].get("cpu_seconds_per_step"), timings[base].get("cpu_seconds_per_step")
                if cpu and base_cpu and min(base_cpu) > 0:
                    value["cpu_" + name] = ratio_ci(cpu, base_cpu)
    return {"case": case.name, "key": case.key, "parameters": sum(p.numel() for p in model.parameters()),
            "batch": case.batch, "rounds": rounds, "load_average": load,
            "variants": {key: results[key] for key in [*VARIANTS, *IN_PROCESS] if key in results}}


def breakdown(model: Path, data: Path, rounds: int, calls: int) -> Dict:
    """Bench-only: one Java train_step call, layer by layer, interleaved in one JVM (see
    StepBenchmark.breakdown): the bare native call, TrainingModule.trainStep."""
    command = [jdk.checked_java(), *libtorch.java_options(), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               f"-Dgradbridge.numThreads={torch.get_num_threads()}",
               "-cp", os.pathsep.join(classpath.resolve().entries), "dev.gradbridge.bench.StepBenchmark",
               "breakdown", str(model), str(data), str(rounds), str(calls)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    per_call = json.loads(result.stdout.strip().splitlines()[-1])["per_call_seconds"]
    return {"calls_per_block": calls, "median_s": {k: statistics.median(v) for k, v in per_call.items()},
            "vs_bare": {k: ratio_ci(v, per_call["bare"]) for k, v in per_call.items() if k != "bare"},
            "per_call_seconds": per_call}


def bench_transfer(rounds: int, megabytes: int) -> Dict:
    """numpy -> Java -> libtorch tensor for a float32 array, beside numpy's own copy, in rounds."""
    x = np.random.default_rng(0).random(megabytes * 1024 * 1024 // 4, dtype=np.float32)
    gigabytes = x.nbytes / 1e9
    out = np.empty_like(x)
    Tensor = jvm.jclass("dev.gradbridge.Tensor")
    DType = jvm.jclass("dev.gradbridge.DType")
    shape = jpype.JArray(jpype.JLong)([len(x)])
    try:
        def zero_copy():  # what java.dataset does: a direct ByteBuffer over numpy's memory, from_blob
            Tensor.fromBuffer(java._direct_buffer(x, "x"), DType.FLOAT32, shape).close()

        def one_copy():  # the same, then converted into memory that libtorch owns
            wrapped = Tensor.fromBuffer(java._direct_buffer(x, "x"), DType.FLOAT32, shape)
            wrapped.copy().close()
            wrapped.close()

        def java_array():  # Java float[] (copy 1) -> Tensor.of(float[]) (copy 2)
            jvm.to_tensor(x).close()

        ways = {
            "numpy copyto (into allocated memory)": lambda: np.copyto(out, x),
            "numpy copy (allocates, like a new tensor)": lambda: x.copy(),
            "direct buffer -> tensor (no copy)": zero_copy,
            "direct buffer -> tensor + one copy": one_copy,
            "Java float[] -> tensor (two copies)": java_array,
        }
        here = _in_process_environment("this Python process")
        timed = run_rounds([Variant(name, _python_block(way), 1, 1, None, here) for name, way in ways.items()],
                           rounds, warmup_s=0.0)
    finally:
        pass
    seconds = {name: statistics.median(timed[name]["step_seconds"]) for name in ways}
    gb_per_s = {name: gigabytes / value for name, value in seconds.items() if "no copy" not in name}
    one, numpy_copy = "direct buffer -> tensor + one copy", "numpy copy (allocates, like a new tensor)"
    # throughput ratio one copy / numpy's copy = numpy's time / one copy's time
    speed = ratio_ci(timed[numpy_copy]["step_seconds"], timed[one]["step_seconds"])
    return {"bytes": x.nbytes, "rounds": rounds, "gb_per_s": gb_per_s, "seconds": seconds,
            "one_copy_vs_numpy_copy_speed": speed}


def bench_startup(model: Path, with_gradle: bool) -> Dict:
    probe = (
        "import json, time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter()\n"
        "from gradbridge import jvm; jvm.start(); jvm.jclass('dev.gradbridge.Tensor').arange(1).close()\n"
        "t2 = time.perf_counter(); jvm.load_module(%r).close(); t3 = time.perf_counter()\n"
        "print(json.dumps({'import torch': t1 - t0, 'JVM + native library': t2 - t1, 'first module load': t3 - t2}))"
    ) % str(model)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    startup = json.loads(result.stdout.strip().splitlines()[-1])
    if with_gradle:
        for _ in range(2):  # the second run is the warm one
            started = time.perf_counter()
            gradle = run_task("run", ["--epochs", 1, "--log-every", 1])
            startup["gradle run (warm)"] = time.perf_counter() - started
            if gradle.returncode != 0:  # reported, so that the other figures are not lost
                errors = [line for line in gradle.stderr.splitlines() if "error" in line.lower()]
                startup["gradle run (warm)"] = float("nan")
                startup["gradle run error"] = (errors or ["exit code %d" % gradle.returncode])[0]
                break
    return startup


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
    """Run every benchmark; print the tables; write bench.json and bench.png into ``out_dir``.

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
    (out_dir / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    write_chart(results, out_dir / "bench.png")
    for line in format_tables(results):
        out(line)
    out(f"\nwrote {out_dir / 'bench.json'} and {out_dir / 'bench.png'}")
    return results


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
    if "seed" in steps:
        found += [_ratio_target("Java train_step (c) <= 1.2x native train_step (e)", steps["seed"], "c", "e", 1.2)]
    for key in ("seed", "mlp", "big"):
        if key in steps:
            found.append(_ratio_target("Java fused (d) <= 1.1x native fused loop (e')", steps[key], "d", "e'", 1.1))
    for key in ("seed", "mlp"):
        if key in steps:
            found.append(_ratio_target("Java train_step (c) <= 0.7x eager Python (a)", steps[key], "c", "a", 0.7))
    if "big" in steps:
        found.append(_ratio_target("Java train_step (c) in its own JVM within 3% of eager Python (a)",
                                   steps["big"], "c", "a", 1.03))
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
    """The questions the benchmark answers with its intervals (issue 16: own process)."""
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


def format_tables(results: Dict) -> List[str]:
    machine = results["machine"]
    lines = [f"gradbridge bench ({'quick' if machine['quick'] else 'full'}): {machine['cpus']} CPUs, torch "
             f"{machine['torch']}, {machine['torch_threads']} intra-op threads, {machine['rounds']} rounds; "
             f"load average {machine['load_average_at_start'][0]:.2f} at start, "
             f"{machine['load_average_at_end'][0]:.2f} at end"]
    for case in results["steps"]:
        lines += ["", f"{case['case']} ({case['parameters']:,} parameters): time per training step, "
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
        lines.append("  (faults: minor page faults per step; ctxsw: context switches per step; cpu: CPU seconds "
                     "per wall second, all threads of the process)")
        lines.append("  CPU time per step (all threads of the process), ratios as above:")
        for key, label in {**VARIANTS, **IN_PROCESS}.items():
            v = case["variants"].get(key)
            if v is None or "cpu_seconds" not in v["per_step"]:
                continue
            lines.append(f"  {'(' + key + ')':<5}{label:<36} {_us(v['per_step']['cpu_seconds']):>10} {'':>10}  "
                         f"{_ci(v.get('cpu_vs_a')):<20} {_ci(v.get('cpu_vs_e')):<20} {_ci(v.get('cpu_vs_e_fused')):<20}")
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
    palette = dict(zip(VARIANTS, ["tab:blue", "tab:cyan", "tab:orange", "tab:red", "tab:gray", "black"]))
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
    figure.savefig(path, dpi=110)
    plt.close(figure)
