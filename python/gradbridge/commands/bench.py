"""`gradbridge bench`: Java-driven training against eager Python and a native libtorch loop.

One run, one machine, one table. Per training step, for each model:

  (a) eager PyTorch + torch.optim                 (b) Python calling the scripted module's train_step
  (c) Java calling train_step per batch (DJL)     (d) Java calling train_epoch (one native call per epoch)
  (e) native C++ loop calling train_step          (e') native C++ loop calling train_epoch

(c) and (d) are timed by loops inside a JVM of their own (dev.gradbridge.bench.StepBenchmark),
as a Java service would run, on the pip wheel's libtorch, the same binary that (a), (b) and (e)
use; (c*) and (d*) are the same loops in this Python process through JPype. (e) is
benchmarks/native/train_loop.cpp, compiled against the pip wheel's libtorch. Every variant runs
the same .pt with the graph executor's optimizations off, autograd on, and the same intra-op
thread count. Also measured:
numpy -> Java -> libtorch transfer, start-up, and resident memory over many Java steps.
Timings are min and median over repeats; nothing here is asserted by tests.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import torch
from torch import nn

from .. import _devtree, classpath, java, jdk, jvm, libtorch
from ..export import export_training_module, losses, optim
from ..gradle import run_task
from ..models import LinearRegression, mlp
from ..torchscript import plain_graph_executor

#: The native loop's source lives in the checkout (benchmarks/native): `gradbridge bench` is a
#: development command.
NATIVE_SOURCE = Path("benchmarks") / "native" / "train_loop.cpp"
VARIANTS = {
    "a": "eager PyTorch + torch.optim",
    "b": "Python -> scripted train_step",
    "c": "Java -> train_step (DJL)",
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
    name: str
    build: Callable[[], nn.Module]
    loss: str
    optimizer: dict
    features: int
    classes: int  # 0: regression with targets [n, 1]
    batch: int
    samples: int  # the fused epoch's size (a multiple of batch)
    calls: int  # timed calls per repeat (step variants); fused variants scale to about the same steps


CASES = [
    Case("linear regression (seed, 100 samples, full batch)", LinearRegression, "mse",
         {"name": "sgd", "lr": 0.01}, 1, 0, 100, 100, 400),
    Case("MLP 32-64-64-10, batch 64", lambda: mlp(32, (64, 64), 10), "cross_entropy",
         {"name": "adam", "lr": 1e-3}, 32, 10, 64, 1024, 300),
    Case("compute-bound MLP 512-1024-512-10 (1.05M params), batch 1024", lambda: mlp(512, (1024, 512), 10),
         "cross_entropy", {"name": "adam", "lr": 1e-4}, 512, 10, 1024, 4096, 8),
]


def _data(case: Case, n: int, seed: int = 0):
    g = np.random.default_rng(seed)
    if case.classes == 0:  # the seed's data: y = 2x + 1 + noise, x in [0, 10)
        x = (g.random((n, 1)) * 10).astype(np.float32)
        return x, (2 * x + 1 + (g.random((n, 1)) - 0.5) * 2).astype(np.float32)
    x = g.standard_normal((n, case.features)).astype(np.float32)
    return x, g.integers(0, case.classes, n).astype(np.int64)


def _per_step(block_seconds: List[float], steps_per_block: int) -> Dict[str, float]:
    per = [s / steps_per_block for s in block_seconds]
    return {"min_s": min(per), "median_s": statistics.median(per)}


def _time_python(step: Callable[[], None], warmup: int, repeats: int, calls: int) -> List[float]:
    for _ in range(warmup):
        step()
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        blocks.append(time.perf_counter() - start)
    return blocks


def _python_block(step: Callable[[], None], calls: int) -> Callable[[], float]:
    def block() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            step()
        return time.perf_counter() - start
    return block


def _interleaved(blocks: Dict[str, Callable[[], float]], warmup_s: float, repeats: int,
                 self_warming=frozenset()) -> Dict[str, List[float]]:
    """Warm every variant up for ``warmup_s`` (JIT, allocator, caches), then time them in
    rounds, one block each per round, so that drift on a busy machine hits all alike.
    Variants in ``self_warming`` (subprocesses) warm up inside each block instead."""
    for key, block in blocks.items():
        if key in self_warming:
            continue
        deadline = time.perf_counter() + warmup_s
        while time.perf_counter() < deadline:
            block()
    timings: Dict[str, List[float]] = {key: [] for key in blocks}
    for _ in range(repeats):
        for key, block in blocks.items():
            timings[key].append(block())
    return timings


def native_binary(out_dir: Path) -> Path:
    """Compile benchmarks/native/train_loop.cpp against the wheel's libtorch (cached).

    The wheel ships TorchConfig.cmake, but the CUDA build's CMake config insists on a CUDA
    toolkit even for CPU code; the compiler flags it would produce are simple, so g++ gets them
    from torch.utils.cpp_extension directly.
    """
    from torch.utils import cpp_extension

    source = _devtree.require_root("gradbridge bench") / NATIVE_SOURCE
    binary = out_dir / "train_loop"
    if binary.exists() and binary.stat().st_mtime > source.stat().st_mtime:
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)
    libs = cpp_extension.library_paths()
    command = ["g++", "-O2", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
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


def _java(model: Path, data: Path, mode: str, warmup: int, repeats: int, calls: int, batch: int,
          threads: int) -> List[float]:
    """StepBenchmark in a JVM of its own, on the wheel's libtorch (no Python in that process)."""
    command = [jdk.checked_java(), *libtorch.djl_options(), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               f"-Dai.djl.pytorch.num_threads={threads}",
               f"-Dai.djl.pytorch.num_interop_threads={torch.get_num_interop_threads()}",
               "-cp", os.pathsep.join(classpath.resolve().entries), "dev.gradbridge.bench.StepBenchmark",
               str(model), str(data), mode, str(warmup), str(repeats), str(calls), str(batch)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["repeat_seconds"]


def _native(binary: Path, model: Path, data: Path, mode: str, warmup: int, repeats: int, calls: int,
            threads: int, batch: int) -> List[float]:
    result = subprocess.run([str(binary), str(model), str(data), mode, str(warmup), str(repeats), str(calls),
                             str(threads), str(batch)], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)["repeat_seconds"]


def bench_steps(case: Case, out_dir: Path, binary: Path, *, repeats: int, calls: int, threads: int,
                warmup_s: float) -> Dict:
    torch.manual_seed(0)
    model = case.build()
    xb, yb = _data(case, case.batch)
    x, y = _data(case, case.samples, seed=1)
    path = export_training_module(model, case.loss, case.optimizer, out_dir / f"{case.name.split()[0]}-{case.batch}.pt",
                                  example_inputs=(torch.from_numpy(xb), torch.from_numpy(yb)))
    batches = case.samples // case.batch
    fused_calls = max(1, calls // batches)
    steps = {"a": calls, "b": calls, "c": calls, "d": fused_calls * batches}

    eager = copy.deepcopy(model)  # (a) eager PyTorch + torch.optim
    optimizer = optim.torch_optimizer(case.optimizer, eager.parameters())
    loss_fn = losses.build({"name": case.loss})
    txb, tyb = torch.from_numpy(xb), torch.from_numpy(yb)

    def eager_step():
        optimizer.zero_grad()
        loss_fn(eager(txb), tyb).backward()
        optimizer.step()

    scripted = torch.jit.load(str(path))  # (b) Python calling the scripted module
    with plain_graph_executor():
        per_call = min(_time_python(lambda: scripted.train_step(txb, tyb), 3, 3, 1))
    warm = max(2, int(min(warmup_s, 0.5) / per_call))  # for the subprocesses, which warm up on their own
    warm_epochs = max(1, warm // batches)

    # (c), (d) in a JVM of their own and (e), (e') the native loop: one subprocess per block
    step_npz, epoch_npz = out_dir / "batch.npz", out_dir / "epoch.npz"
    np.savez(step_npz, x=xb, y=yb)
    np.savez(epoch_npz, x=x, y=y)
    step_bin, epoch_bin = out_dir / "batch.bin", out_dir / "epoch.bin"
    _write_native_data(step_bin, xb, yb)
    _write_native_data(epoch_bin, x, y)
    subprocess_blocks = {
        "c": lambda: _java(path, step_npz, "step", warm, 1, calls, case.batch, threads)[0],
        "d": lambda: _java(path, epoch_npz, "fused", warm_epochs, 1, fused_calls, case.batch, threads)[0],
        "e": lambda: _native(binary, path, step_bin, "step", warm, 1, calls, threads, case.batch)[0],
        "e'": lambda: _native(binary, path, epoch_bin, "fused", warm_epochs, 1, fused_calls, threads, case.batch)[0],
    }

    Bench = jvm.jclass("dev.gradbridge.bench.StepBenchmark")
    module = jvm.load_module(path)  # (c*), (d*): loops and clock inside the JVM, in this process
    try:
        with jvm.java_errors(), plain_graph_executor():
            manager = module.getManager().newSubManager()
            jxb, jyb = jvm.to_ndarray(manager, xb), jvm.to_ndarray(manager, yb)
            jx, jy = jvm.to_ndarray(manager, x), jvm.to_ndarray(manager, y)
            perm = jvm.to_ndarray(manager, np.arange(case.samples, dtype=np.int64))
            timings = _interleaved({
                "a": _python_block(eager_step, calls),
                "b": _python_block(lambda: scripted.train_step(txb, tyb), calls),
                "c*": lambda: float(Bench.trainStep(module, jxb, jyb, 0, 1, calls)[0]),
                "d*": lambda: float(Bench.trainEpoch(module, jx, jy, perm, case.batch, 0, 1, fused_calls)[0]),
                **subprocess_blocks,
            }, warmup_s, repeats, self_warming=set(subprocess_blocks))
    finally:
        module.close()
    steps.update({"c*": steps["c"], "d*": steps["d"], "e": calls, "e'": steps["d"]})
    results = {key: _per_step(blocks, steps[key]) for key, blocks in timings.items()}
    for key, value in results.items():
        value["vs_a"] = value["median_s"] / results["a"]["median_s"]
        value["vs_e"] = value["median_s"] / results["e"]["median_s"]
        value["vs_e_fused"] = value["median_s"] / results["e'"]["median_s"]
    return {"case": case.name, "parameters": sum(p.numel() for p in model.parameters()), "batch": case.batch,
            "variants": {key: results[key] for key in [*VARIANTS, *IN_PROCESS]}}


def bench_transfer(repeats: int, megabytes: int) -> Dict:
    """numpy -> Java -> libtorch tensor for a float32 array, beside numpy's own copy."""
    x = np.random.default_rng(0).random(megabytes * 1024 * 1024 // 4, dtype=np.float32)
    gigabytes = x.nbytes / 1e9
    out = np.empty_like(x)
    Shape = jvm.jclass("ai.djl.ndarray.types.Shape")
    DataType = jvm.jclass("ai.djl.ndarray.types.DataType")
    manager = jvm.jclass("ai.djl.ndarray.NDManager").newBaseManager("PyTorch")
    try:
        def zero_copy():  # what java.dataset does: a direct ByteBuffer over numpy's memory, from_blob
            manager.create(java._direct_buffer(x, "x"), Shape(len(x)), DataType.FLOAT32).close()

        def one_copy():  # the same, then duplicated into memory that libtorch owns
            wrapped = manager.create(java._direct_buffer(x, "x"), Shape(len(x)), DataType.FLOAT32)
            wrapped.duplicate().close()
            wrapped.close()

        def java_array():  # Java float[] (copy 1) -> NDManager.create(float[]) (copy 2)
            jvm.to_ndarray(manager, x).close()

        timings = {
            "numpy copyto (into allocated memory)": min(_time_python(lambda: np.copyto(out, x), 1, repeats, 1)),
            "numpy copy (allocates, like a new tensor)": min(_time_python(lambda: x.copy(), 1, repeats, 1)),
            "direct buffer -> tensor (no copy)": min(_time_python(zero_copy, 1, repeats, 1)),
            "direct buffer -> tensor + one copy": min(_time_python(one_copy, 1, repeats, 1)),
            "Java float[] -> tensor (two copies)": min(_time_python(java_array, 1, repeats, 1)),
        }
    finally:
        manager.close()
    gb_per_s = {name: gigabytes / seconds for name, seconds in timings.items() if "no copy" not in name}
    return {"bytes": x.nbytes, "gb_per_s": gb_per_s, "seconds": timings}


def bench_memory(steps: int, chunk: int = 500) -> Dict:
    """Resident memory after every chunk of Java train_step calls (MLP, batch 64)."""
    case = CASES[1]
    torch.manual_seed(0)
    xb, yb = _data(case, case.batch)
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    path = export_training_module(case.build(), case.loss, case.optimizer, folder / "gradbridge-bench-memory.pt",
                                  example_inputs=(torch.from_numpy(xb), torch.from_numpy(yb)))
    Bench = jvm.jclass("dev.gradbridge.bench.StepBenchmark")
    module = jvm.load_module(path)
    rss = []
    try:
        manager = module.getManager().newSubManager()
        jxb, jyb = jvm.to_ndarray(manager, xb), jvm.to_ndarray(manager, yb)
        for done in range(0, steps + 1, chunk):
            if done:
                Bench.trainStep(module, jxb, jyb, 0, 1, chunk)
            rss.append((done, _rss_bytes()))
    finally:
        module.close()
    warm = rss[len(rss) // 2:]  # the first half warms up the JIT, the heap and the allocator
    xs = np.array([s for s, _ in warm], dtype=np.float64)
    ys = np.array([r for _, r in warm], dtype=np.float64)
    slope, intercept = np.polyfit(xs, ys, 1)
    residual = ys - (slope * xs + intercept)
    stderr = float(np.sqrt(residual.var(ddof=2) / ((xs - xs.mean()) ** 2).sum())) if len(xs) > 2 else float("nan")
    return {"steps": steps, "samples": rss, "slope_bytes_per_step": float(slope), "slope_stderr": stderr,
            "growth_bytes_after_warmup": int(warm[-1][1] - warm[0][1])}


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def bench_startup(model: Path, with_gradle: bool) -> Dict:
    probe = (
        "import json, time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter()\n"
        "from gradbridge import jvm; jvm.start(); jvm.jclass('ai.djl.engine.Engine').getEngine('PyTorch')\n"
        "t2 = time.perf_counter(); jvm.load_module(%r).close(); t3 = time.perf_counter()\n"
        "print(json.dumps({'import torch': t1 - t0, 'JVM + DJL engine': t2 - t1, 'first module load': t3 - t2}))"
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


def run(*, quick: bool, out_dir: str | os.PathLike, out: Callable[[str], None] = print) -> Dict:
    """Run every benchmark; print the tables; write bench.json and bench.png into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    repeats = 2 if quick else 9
    jvm.start()
    binary = native_binary(out_dir / "native")
    results = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": threads,
                           "torch": torch.__version__, "quick": quick}}
    results["steps"] = [bench_steps(case, out_dir, binary, repeats=repeats, threads=threads,
                                    calls=max(2, case.calls // (10 if quick else 1)), warmup_s=0.2 if quick else 2.0)
                        for case in CASES]
    results["transfer"] = bench_transfer(repeats, 16 if quick else 256)
    results["memory"] = bench_memory(2_000 if quick else 20_000)
    results["startup"] = bench_startup(out_dir / f"{CASES[0].name.split()[0]}-{CASES[0].batch}.pt", with_gradle=not quick)
    results["targets"] = targets(results)
    (out_dir / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    write_chart(results, out_dir / "bench.png")
    for line in format_tables(results):
        out(line)
    out(f"\nwrote {out_dir / 'bench.json'} and {out_dir / 'bench.png'}")
    return results


def targets(results: Dict) -> List[Dict]:
    """The issue's targets, each with the figures it was judged on."""
    steps = {r["case"]: r["variants"] for r in results["steps"]}
    seed, mlp64, big = (steps[case.name] for case in CASES)
    transfer = results["transfer"]["gb_per_s"]
    memory = results["memory"]
    return [
        {"target": "Java train_step (c) <= 0.7x eager Python (a): linear regression",
         "value": seed["c"]["vs_a"], "met": seed["c"]["vs_a"] <= 0.7},
        {"target": "Java train_step (c) <= 0.7x eager Python (a): MLP batch 64",
         "value": mlp64["c"]["vs_a"], "met": mlp64["c"]["vs_a"] <= 0.7},
        *[{"target": f"Java fused (d) <= 1.3x native train_epoch (e'): {name}", "value": v["d"]["vs_e_fused"],
           "met": v["d"]["vs_e_fused"] <= 1.3} for name, v in steps.items()],
        {"target": "compute-bound MLP: Java train_step (c) within 3% of Python (a)",
         "value": big["c"]["vs_a"], "met": big["c"]["vs_a"] <= 1.03},
        {"target": "transfer with one copy >= 0.5x numpy's allocating copy",
         "value": transfer["direct buffer -> tensor + one copy"] / transfer["numpy copy (allocates, like a new tensor)"],
         "met": transfer["direct buffer -> tensor + one copy"] >= 0.5 * transfer["numpy copy (allocates, like a new tensor)"]},
        {"target": "memory slope indistinguishable from zero (|slope| <= 2 stderr or < 1 byte/step)",
         "value": memory["slope_bytes_per_step"],
         "met": abs(memory["slope_bytes_per_step"]) <= max(2 * memory["slope_stderr"], 1.0)},
    ]


def format_tables(results: Dict) -> List[str]:
    lines = [f"gradbridge bench ({'quick' if results['machine']['quick'] else 'full'}): "
             f"{results['machine']['cpus']} CPUs, torch {results['machine']['torch']}, "
             f"{results['machine']['torch_threads']} intra-op threads"]
    for case in results["steps"]:
        lines += ["", f"{case['case']} ({case['parameters']:,} parameters): time per training step",
                  f"  {'variant':<41} {'min':>11} {'median':>11} {'vs (a)':>8} {'vs (e)':>8} {'vs (e)' + chr(39):>8}"]
        for key, label in {**VARIANTS, **IN_PROCESS}.items():
            v = case["variants"][key]
            lines.append(f"  {'(' + key + ')':<5}{label:<36} {_us(v['min_s']):>11} {_us(v['median_s']):>11} "
                         f"{v['vs_a']:>7.2f}x {v['vs_e']:>7.2f}x {v['vs_e_fused']:>7.2f}x")
    transfer = results["transfer"]
    lines += ["", f"transfer of {transfer['bytes'] / 2**20:.0f} MiB float32 (numpy -> libtorch tensor in the JVM)"]
    lines += [f"  {name:<44} {seconds * 1e3:>9.2f} ms" + (f" {transfer['gb_per_s'][name]:>8.2f} GB/s"
                                                          if name in transfer["gb_per_s"] else "")
              for name, seconds in transfer["seconds"].items()]
    memory = results["memory"]
    lines += ["", f"resident memory over {memory['steps']:,} Java train_step calls (MLP, batch 64): slope "
                  f"{memory['slope_bytes_per_step']:.2f} +- {memory['slope_stderr']:.2f} bytes/step, "
                  f"{memory['growth_bytes_after_warmup'] / 2**20:+.2f} MiB after warm-up"]
    lines += ["", "start-up (seconds)"] + [f"  {name:<30} {seconds:>8.3f}" if isinstance(seconds, float)
                                           else f"  {name:<30} {seconds}" for name, seconds in results["startup"].items()]
    lines += ["", "targets"] + [f"  [{'met' if t['met'] else 'MISSED'}] {t['target']}: {t['value']:.3g}"
                                for t in results["targets"]]
    return lines


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def write_chart(results: Dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["steps"]
    figure, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4.5))
    colors = ["tab:blue", "tab:cyan", "tab:orange", "tab:red", "tab:gray", "black"]
    for ax, case in zip(axes, cases):
        keys = list(VARIANTS)
        medians = [case["variants"][k]["median_s"] * 1e6 for k in keys]
        bars = ax.bar([f"({k})" for k in keys], medians, color=colors)
        for bar, key in zip(bars, keys):
            ax.annotate(f"{case['variants'][key]['vs_a']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_title(case["case"], fontsize=9, wrap=True)
        ax.set_ylabel("median time per step (us)")
    figure.legend([plt.Rectangle((0, 0), 1, 1, color=c) for c in colors],
                  [f"({k}) {v}" for k, v in VARIANTS.items()], loc="lower center", ncol=3, fontsize=8)
    figure.suptitle("gradbridge: time per training step (labels: ratio to eager PyTorch)")
    figure.tight_layout(rect=(0, 0.1, 1, 0.95))
    figure.savefig(path, dpi=110)
    plt.close(figure)
