"""`gradbridge bench`'s cases and benchmarks: the models it times, the training-step variants (a) to (e'),
the per-call breakdown, numpy -> Java transfer and start-up."""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jpype
import numpy as np
import torch
from torch import nn

from .._runtime import classpath, torchscript
from .._runtime.launcher import java_command
from .. import jvm, messages
from ..errors import ExportError, SetupError
from ..export import export_training_module
from ..spec import losses, optim
from .._runtime.gradle import run_task
from ..models import SEED_LR, LinearRegression, mlp
from .._runtime.torchscript import plain_graph_executor
from .stats import ratio_ci
from .workers import (JavaSettings, Variant, Worker, _in_process_environment, _in_process_jvm_options,
                      _java_worker, _native_worker, _python_block, _worker_variant, _write_native_data, run_rounds)

VARIANTS = {
    "a": "eager PyTorch + torch.optim",
    "b": "Python -> scripted train_step",
    "c": "Java -> train_step",
    "d": "Java -> train_epoch (fused)",
    "e": "native C++ -> train_step",
    "e'": "native C++ -> train_epoch",
    "d3": "Java -> train_epoch, protocol 3",
}
#: Java inside this Python process (JPype), for comparison: libtorch's autograd engine is then
#: the Python one, which manages the GIL around every backward pass.
IN_PROCESS = {
    "c*": "Java -> train_step, in Python (JPype)",
    "d*": "Java -> train_epoch, in Python (JPype)",
    "d3*": "protocol 3 (d3) in Python (JPype)",
}
#: The cases whose model is also exported in format='export' (protocol 3: the training step captured with
#: torch.export, run op by op by the native layer) for (d3) and (d3*), beside TorchScript's (d) and (d*).
PROTOCOL3 = ("mlp", "resnet18", "transformer", "lstm")


@dataclass
class Case:
    key: str  # --cases name
    name: str
    build: Callable[[], nn.Module]
    loss: str
    optimizer: dict
    input_shape: Tuple[int, ...]  # one sample's
    classes: int  # 0: regression with targets [n, 1]
    batch: int
    samples: int  # the fused epoch's size (a multiple of batch)
    calls: int  # calls per block (step variants); fused variants scale to about the same steps


def _resnet18() -> nn.Module:
    try:
        import torchvision
    except ImportError:
        raise SetupError(messages.bench_needs("resnet18", "torchvision")) from None
    return torchvision.models.resnet18(num_classes=10)


class _Encoder(nn.Module):
    """A 2-layer transformer encoder (d=128, 4 heads, sequences of 64) over features, mean-pooled."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


class _Recurrent(nn.Module):
    """A 2-layer LSTM (hidden 128) over sequences of 32 steps of 32 features; the last step's output."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(32, 128, num_layers=2, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


ADAM = {"name": "adam", "lr": 1e-3}
CASES = [
    Case("seed", "linear regression (seed, 100 samples, full batch)", LinearRegression, "mse",
         {"name": "sgd", "lr": SEED_LR}, (1,), 0, 100, 100, 400),
    Case("mlp", "MLP 32-64-64-10, batch 64", lambda: mlp(32, (64, 64), 10), "cross_entropy",
         ADAM, (32,), 10, 64, 1024, 300),
    Case("big", "compute-bound MLP 512-1024-512-10 (1.05M params), batch 1024", lambda: mlp(512, (1024, 512), 10),
         "cross_entropy", {"name": "adam", "lr": 1e-4}, (512,), 10, 1024, 4096, 8),
    # Real model shapes (issue "Real models at eager speed"): the Java fused epoch against eager.
    Case("resnet18", "torchvision ResNet-18, 32x32 images, batch 32", _resnet18, "cross_entropy",
         ADAM, (3, 32, 32), 10, 32, 256, 8),
    Case("transformer", "transformer encoder (2 layers, d=128, 4 heads, seq 64), batch 32", _Encoder,
         "cross_entropy", ADAM, (64, 128), 10, 32, 256, 8),
    Case("lstm", "LSTM (2 layers, hidden 128, seq 32), batch 32", _Recurrent, "cross_entropy",
         ADAM, (32, 32), 10, 32, 256, 16),
]
#: The cases of real model shapes, where Java's fused epoch is to be at most eager's time.
REAL_MODELS = ("resnet18", "transformer", "lstm")


def _data(case: Case, n: int, seed: int = 0):
    g = np.random.default_rng(seed)
    if case.classes == 0:  # the seed's data: y = 2x + 1 + noise, x in [0, 10)
        x = (g.random((n, 1)) * 10).astype(np.float32)
        return x, (2 * x + 1 + (g.random((n, 1)) - 0.5) * 2).astype(np.float32)
    x = g.standard_normal((n, *case.input_shape)).astype(np.float32)
    return x, g.integers(0, case.classes, n).astype(np.int64)


def _export(case: Case, out_dir: Path, format: str = "auto"):
    """The case's model (seeded) and its exported training module (``format``: export_training_module's)."""
    torch.manual_seed(0)
    model = case.build()
    xb, yb = _data(case, case.batch)
    suffix = "-export" if format == "export" else ""
    path = export_training_module(model, case.loss, case.optimizer, out_dir / f"{case.key}-{case.batch}{suffix}.pt",
                                  example_inputs=(torch.from_numpy(xb), torch.from_numpy(yb)), format=format)
    return model, path


def bench_steps(case: Case, out_dir: Path, binary: Path, *, rounds: int, calls: int, threads: int,
                warmup_s: float, java: JavaSettings, only: Sequence[str] = (),
                out: Callable[[str], None] | None = None) -> Dict:
    model, path = _export(case, out_dir)
    xb, yb = _data(case, case.batch)
    x, y = _data(case, case.samples, seed=1)
    batches = case.samples // case.batch
    fused_calls = max(1, calls // batches)
    protocol3 = ("d3", "d3*")
    # refused: why protocol 3 cannot export the case's model: reported, the other variants still run
    exported, refused = _protocol3_export(case, out_dir) if (not only or set(only) & set(protocol3)) else (None, None)
    wanted = lambda key: (not only or key in only) and (key not in protocol3 or exported is not None)  # noqa: E731

    eager = copy.deepcopy(model)  # (a) eager PyTorch + torch.optim
    optimizer = optim.torch_optimizer(case.optimizer, eager.parameters())
    loss_fn = losses.build({"name": case.loss})
    txb, tyb = torch.from_numpy(xb), torch.from_numpy(yb)

    def eager_step():
        optimizer.zero_grad()
        loss_fn(eager(txb), tyb).backward()
        optimizer.step()

    scripted = torchscript.load(str(path))  # (b) Python calling the scripted module
    files = _data_files(out_dir, xb, yb, x, y)

    here = _in_process_environment("this Python process")
    variants: List[Variant] = []
    workers: List[Worker] = []
    held: list = []  # the modules loaded in this process's JVM, closed after the rounds
    try:
        if wanted("a"):
            variants.append(Variant("a", _python_block(eager_step), calls, 1, None, here))
        if wanted("b"):
            variants.append(Variant("b", _python_block(lambda: scripted.train_step(txb, tyb)), calls, 1, None, here))
        variants += _worker_variants(case, path, exported, binary, wanted, workers, files, threads=threads, java=java,
                                     calls=calls, fused_calls=fused_calls, batches=batches)
        if wanted("c*") or wanted("d*") or wanted("d3*"):  # loops and clock inside the JVM, in this process (JPype)
            variants += _in_process_variants(case, path, exported, wanted, held, (xb, yb, x, y), here,
                                             calls=calls, fused_calls=fused_calls, batches=batches)
        load = {"before": os.getloadavg()}
        with jvm.java_errors(), plain_graph_executor():
            timings = run_rounds(variants, rounds, warmup_s=warmup_s, out=out)
        load["after"] = os.getloadavg()
    finally:
        for worker in workers:
            worker.close()
        for module in held:
            module.close()
    results = _variant_results(variants, timings)
    return {"case": case.name, "key": case.key, "parameters": sum(p.numel() for p in model.parameters()),
            "batch": case.batch, "rounds": rounds, "load_average": load,
            "variants": {key: results[key] for key in [*VARIANTS, *IN_PROCESS] if key in results},
            **({"protocol3_refused": refused} if refused else {})}


def _protocol3_export(case: Case, out_dir: Path) -> Tuple[Optional[Path], Optional[str]]:
    """The case's model exported with protocol 3 (a case of ``PROTOCOL3``), or why that export refused it."""
    if case.key not in PROTOCOL3:
        return None, None
    try:
        return _export(case, out_dir, format="export")[1], None
    except ExportError as ex:
        return None, str(ex)


def _data_files(out_dir: Path, xb: np.ndarray, yb: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple:
    """The batch's and the epoch's data as the workers read them: .npz (the JVM), then .bin (the native loop)."""
    step_npz, epoch_npz = out_dir / "batch.npz", out_dir / "epoch.npz"
    np.savez(step_npz, x=xb, y=yb)
    np.savez(epoch_npz, x=x, y=y)
    step_bin, epoch_bin = out_dir / "batch.bin", out_dir / "epoch.bin"
    _write_native_data(step_bin, xb, yb)
    _write_native_data(epoch_bin, x, y)
    return step_npz, epoch_npz, step_bin, epoch_bin


def _worker_variants(case: Case, path: Path, exported: Optional[Path], binary: Path, wanted: Callable[[str], bool],
                     workers: List[Worker], files: tuple, *, threads: int, java: JavaSettings, calls: int,
                     fused_calls: int, batches: int) -> List[Variant]:
    """(c), (d), (d3): a JVM of their own; (e), (e'): the native loop; each a worker process, added to
    ``workers`` as it starts (the caller closes them). ``files``: the batch's and the epoch's .npz, then .bin."""
    step_npz, epoch_npz, step_bin, epoch_bin = files
    own_jvm = f"a JVM of its own{' on CPUs ' + java.cpus if java.cpus else ''}"
    started = []  # all workers load at once; each is asked for its settings line afterwards
    for key, data, mode, n in (("c", step_npz, "step", calls), ("d", epoch_npz, "fused", fused_calls),
                               ("d3", epoch_npz, "fused", fused_calls)):
        if wanted(key):
            workers.append(_java_worker(exported if key == "d3" else path, data, mode, case.batch, threads, java))
            started.append((key, workers[-1], n, 1 if mode == "step" else batches, own_jvm, java.env))
    for key, data, mode, n in (("e", step_bin, "step", calls), ("e'", epoch_bin, "fused", fused_calls)):
        if wanted(key):
            workers.append(_native_worker(binary, path, data, mode, threads, case.batch))
            started.append((key, workers[-1], n, 1 if mode == "step" else batches, "a native process", None))
    return [_worker_variant(*worker) for worker in started]


def _in_process_variants(case: Case, path: Path, exported: Optional[Path], wanted: Callable[[str], bool], held: list,
                         arrays: tuple, here: Dict, *, calls: int, fused_calls: int, batches: int) -> List[Variant]:
    """(c*), (d*), (d3*): the loops and the clock inside the JVM, in this process (JPype); the modules they
    load go to ``held`` as they load (the caller closes them). ``arrays``: the batch's x, y, the epoch's x, y."""
    xb, yb, x, y = arrays
    Bench = jvm.jclass("dev.gradbridge.bench.StepBenchmark")
    module = jvm.load_module(path)
    held.append(module)
    module3 = jvm.load_module(exported) if wanted("d3*") else None
    if module3 is not None:
        held.append(module3)
    jxb, jyb = jvm.to_tensor(xb), jvm.to_tensor(yb)
    jx, jy = jvm.to_tensor(x), jvm.to_tensor(y)
    perm = jvm.to_tensor(np.arange(case.samples, dtype=np.int64))
    # Starting the engine here tunes this process's allocator too (dev.gradbridge.NativeMemory)
    here["native_memory"] = str(jvm.jclass("dev.gradbridge.internal.ModuleAccess").nativeMemory())
    in_jvm = {**here, "where": "this Python process (JPype)", "jvm_options": _in_process_jvm_options()}
    variants = []
    if wanted("c*"):
        variants.append(Variant("c*", lambda n: float(Bench.trainStep(module, jxb, jyb, 0, 1, n)[0]),
                                calls, 1, None, in_jvm))
    if wanted("d*"):
        variants.append(Variant("d*", lambda n: float(Bench.trainEpoch(module, jx, jy, perm, case.batch,
                                                                       0, 1, n)[0]),
                                fused_calls, batches, None, in_jvm))
    if wanted("d3*"):
        variants.append(Variant("d3*", lambda n: float(Bench.trainEpoch(module3, jx, jy, perm, case.batch,
                                                                        0, 1, n)[0]),
                                fused_calls, batches, None, in_jvm))
    return variants


def _variant_results(variants: List[Variant], timings: Dict) -> Dict:
    """Each variant's figures from its rounds: medians per step, its counters, and its ratios to (a), (e) and
    (e') in wall time and in CPU time."""
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
    return results


def breakdown(model: Path, data: Path, rounds: int, calls: int) -> Dict:
    """Bench-only: one Java train_step call, layer by layer, interleaved in one JVM (see
    StepBenchmark.breakdown): the bare native call, TrainingModule.trainStep."""
    command = java_command("dev.gradbridge.bench.StepBenchmark", ["breakdown", model, data, rounds, calls],
                           entries=classpath.resolve().entries,
                           jvm_options=["-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                                        f"-Dgradbridge.numThreads={torch.get_num_threads()}"])
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
            Tensor.fromBuffer(jvm.direct_buffer(x, "x"), DType.FLOAT32, shape).close()

        def one_copy():  # the same, then converted into memory that libtorch owns
            wrapped = Tensor.fromBuffer(jvm.direct_buffer(x, "x"), DType.FLOAT32, shape)
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
