"""`gradbridge bench`'s memory check: over a long run, does resident memory reach a plateau or leak?

Resident memory grows while the JIT, the JVM heap and the allocators warm up (in-process Java
``train_step`` on the bench MLP: for about the first 100,000 steps), then stays flat; a window
shorter than the warm-up mistakes it for a leak. So each surface runs long and ``classify``
judges the *last* window only, against the window before it:

- plateau: the last window's slope is within noise of zero (2 standard errors) or under
  ``FLAT_BYTES_PER_STEP``;
- leak: it is not, and it is not slowing down (at least half the slope of the window before);
- still settling: it grows, but slower than before: run longer (``--memory-steps``).

Surfaces: Java ``train_step`` inside this process (JPype), the Trainer CLI (``gradbridge-train``
in a JVM of its own, RSS of that process sampled from /proc) and the online learner inside this
process (``OnlineLearner.learn``, one update per micro-batch).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch

from .. import jvm
from .._runtime import launcher
from ..export import export_training_module

#: A slope below this (bytes per step) counts as flat whatever the noise: 1 byte/step is 100 kB
#: per 100,000 steps.
FLAT_BYTES_PER_STEP = 1.0
#: The judged window: the last 40% of the samples, compared with the 40% before it.
WINDOW = 0.4
PLATEAU, LEAK, SETTLING = "plateau", "leak", "still settling"
#: Steps (updates) per surface: long enough to pass the ~100,000-step warm-up.
DEFAULT_STEPS = 200_000
#: --quick (the tests): a short run that exercises every surface and the verdict, which then
#: usually says "leak" or "still settling": it sees only warm-up.
QUICK_STEPS = 1_000


def rss_bytes(pid: int | str = "self") -> int:
    """VmRSS of a process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _fit(samples: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """Least-squares slope and its standard error."""
    xs = np.array([s for s, _ in samples], dtype=np.float64)
    ys = np.array([r for _, r in samples], dtype=np.float64)
    slope, intercept = np.polyfit(xs, ys, 1)
    residual = ys - (slope * xs + intercept)
    spread = ((xs - xs.mean()) ** 2).sum()
    stderr = float(np.sqrt(residual.var(ddof=2) / spread)) if len(xs) > 2 and spread > 0 else float("inf")
    return float(slope), stderr


def classify(samples: Sequence[Tuple[float, float]]) -> Dict:
    """Plateau, leak or still settling, from (step, rss bytes) samples of one long run."""
    k = max(3, int(len(samples) * WINDOW))
    if len(samples) < 2 * k:
        raise ValueError(f"memory: {len(samples)} samples; need at least {2 * k}")
    last, before = samples[-k:], samples[-2 * k:-k]
    slope, stderr = _fit(last)
    slope_before, _ = _fit(before)
    if abs(slope) <= max(2 * stderr, FLAT_BYTES_PER_STEP):
        kind = PLATEAU
    elif slope >= 0.5 * slope_before:
        kind = LEAK
    else:
        kind = SETTLING
    return {"verdict": kind, "slope_bytes_per_step": slope, "slope_stderr": stderr,
            "slope_before_bytes_per_step": slope_before, "window_steps": [last[0][0], last[-1][0]],
            "warmup_growth_bytes": int(last[0][1] - samples[0][1]),
            "window_growth_bytes": int(last[-1][1] - last[0][1])}


def describe(result: Dict) -> str:
    window = result["window_steps"]
    text = (f"{result['verdict']}: {result['slope_bytes_per_step']:.2f} +- {result['slope_stderr']:.2f} bytes/step "
            f"over steps {window[0]:,.0f}..{window[1]:,.0f} ({result['window_growth_bytes'] / 2**20:+.2f} MiB), "
            f"{result['warmup_growth_bytes'] / 2**20:+.2f} MiB before")
    if result["verdict"] == SETTLING:
        text += "; run longer to tell"
    return text


def _mlp_module(folder: Path, features: int = 32, classes: int = 10, batch: int = 64):
    """The bench's MLP 32-64-64-10 (Adam) exported, and one batch."""
    from ..models import mlp

    torch.manual_seed(0)
    g = np.random.default_rng(0)
    x = g.standard_normal((batch, features)).astype(np.float32)
    y = g.integers(0, classes, batch).astype(np.int64)
    path = export_training_module(mlp(features, (64, 64), classes), "cross_entropy", {"name": "adam", "lr": 1e-3},
                                  folder / "gradbridge-bench-memory.pt",
                                  example_inputs=(torch.from_numpy(x), torch.from_numpy(y)))
    return path, x, y


def _sampled(steps: int, samples: int, advance: Callable[[int], None]) -> List[Tuple[int, int]]:
    """(steps done, RSS) after each of ``samples`` chunks, on one intra-op thread: the figure is
    memory, and on a loaded machine an OpenMP team that waits for descheduled threads only costs time."""
    chunk = max(1, steps // samples)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rss = [(0, rss_bytes())]
        for done in range(chunk, steps + 1, chunk):
            advance(chunk)
            rss.append((done, rss_bytes()))
    finally:
        torch.set_num_threads(threads)
    return rss


def in_process(steps: int, samples: int = 80) -> Dict:
    """Java train_step calls inside this process (JPype), RSS of this process."""
    with tempfile.TemporaryDirectory(prefix="gradbridge-memory-") as folder:
        path, xb, yb = _mlp_module(Path(folder))
        bench = jvm.jclass("dev.gradbridge.bench.StepBenchmark")
        module = jvm.load_module(path)
        try:
            jxb, jyb = jvm.to_tensor(xb), jvm.to_tensor(yb)
            rss = _sampled(steps, samples, lambda n: bench.trainStep(module, jxb, jyb, 0, 1, n))
        finally:
            module.close()
    return {"surface": "Java train_step in this process (JPype)", "steps": steps, "samples": rss, **classify(rss)}


def online_learner(updates: int, samples: int = 80, batch: int = 32) -> Dict:
    """OnlineLearner.learn in this process: one micro-batch of ``batch`` events per update."""
    import jpype

    HostTensor = jvm.jclass("dev.gradbridge.online.HostTensor")
    Paths = jvm.jclass("java.nio.file.Paths")
    TimeUnit = jvm.jclass("java.util.concurrent.TimeUnit")
    with tempfile.TemporaryDirectory(prefix="gradbridge-memory-") as folder:
        path, x, y = _mlp_module(Path(folder), batch=batch)
        learner = (jvm.jclass("dev.gradbridge.online.OnlineLearner").builder().optMaxBatch(batch)
                   .optPublishEvery(100).optCheckpointEvery(1_000_000).optQueueCapacity(batch * 64)
                   .optFsync(jvm.jclass("dev.gradbridge.online.FsyncPolicy").parse("never"))
                   .open(Paths.get(str(path)), Paths.get(f"{folder}/log")))
        hx = HostTensor.ofFloats(jpype.JArray(jpype.JFloat)(x.ravel().tolist()), *x.shape)
        hy = HostTensor.ofLongs(jpype.JArray(jpype.JLong)(y.tolist()), *y.shape)

        def advance(n: int) -> None:
            for _ in range(n):
                learner.offer(hx, hy, None, 60, TimeUnit.SECONDS)
            learner.awaitIdle(600, TimeUnit.SECONDS)

        try:
            rss = _sampled(updates, samples, advance)
        finally:
            learner.close()
    return {"surface": "OnlineLearner.learn in this process (JPype)", "steps": updates, "samples": rss,
            **classify(rss)}


def trainer_cli(steps: int, interval_s: float = 0.1, batch: int = 64) -> Dict:
    """``gradbridge-train`` in a JVM of its own (step mode, digests only), its RSS sampled every
    ``interval_s``; a sample's step is its time since the first epoch began at the run's mean rate."""
    per_epoch = 500
    epochs = max(2, steps // per_epoch)
    with tempfile.TemporaryDirectory(prefix="gradbridge-memory-") as folder:
        path, _, _ = _mlp_module(Path(folder), batch=batch)
        g = np.random.default_rng(1)
        x = g.standard_normal((per_epoch * batch, 32)).astype(np.float32)
        np.savez(Path(folder) / "train.npz", x=x, y=g.integers(0, 10, len(x)).astype(np.int64))
        command = launcher.command(launcher.TRAIN_MAIN, ["--model", path, "--data", Path(folder) / "train.npz",
                                                         "--epochs", epochs, "--batch-size", batch, "--mode", "step",
                                                         "--digests-only", "--no-progress"])
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   env=dict(os.environ, OMP_NUM_THREADS="1"))
        timed = []
        started = time.perf_counter()
        while process.poll() is None:
            timed.append((time.perf_counter() - started, rss_bytes(process.pid)))
            time.sleep(interval_s)
        stderr = process.stderr.read()
        if process.returncode != 0:
            raise RuntimeError(f"gradbridge-train failed: {launcher.error_line(stderr, process.returncode)}")
    timed = [(t, r) for t, r in timed if r > 0]
    # the JVM's start-up and the module load (first ~10%) are not steps
    begin = timed[len(timed) // 10][0]
    rate = epochs * per_epoch / (timed[-1][0] - begin)
    rss = [((t - begin) * rate, r) for t, r in timed if t >= begin]
    return {"surface": "gradbridge-train in its own JVM", "steps": epochs * per_epoch, "samples": rss,
            "steps_per_second": rate, **classify(rss)}


def run_all(steps: int) -> Dict[str, Dict]:
    return {"in_process": in_process(steps), "trainer_cli": trainer_cli(steps), "online_learner": online_learner(steps)}
