"""`gradbridge online-bench`: the online learner's two figures, and the same for the service a
Python team would otherwise write, side by side, in one run.

1. predict p50/p99 latency with training running vs with training off (goal: at most 2x);
2. learning throughput (events applied per second) vs plain batch training at the same
   micro-batch size (goal: at least 0.8x).

Java: ``dev.gradbridge.bench.OnlineBenchmark`` in a JVM of its own (OnlineLearner: log written,
fsync never, loss validation off; against the fused ``train_epoch``). Python: one eager model
behind a lock, a training thread taking micro-batches from a queue (torch.optim), predictions
under the same lock (the usual shape of such a service); against a plain ``for`` loop of
torch.optim steps. Both are measured as libraries, without HTTP in front.
"""

from __future__ import annotations

import json
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict

import numpy as np
import torch

from .. import launcher, protocol
from ..export import export_builtin
from ..reference import Reference

CLASSES = 4
FEATURES = 16


def _percentile(values, q):
    return float(np.sort(np.asarray(values))[min(len(values) - 1, int(np.floor(q * (len(values) - 1) + 0.5)))])


class PythonOnlineService:
    """What a Python team would write: one model, one lock, a trainer thread fed by a queue."""

    def __init__(self, model_path, batch: int, wait_s: float = 0.001):
        self.reference = Reference(model_path)
        self.lock = threading.Lock()
        self.queue: "queue.Queue" = queue.Queue(maxsize=batch * 8)
        self.batch, self.wait_s = batch, wait_s
        self.updates = 0
        self.stopped = False
        self.thread = threading.Thread(target=self._train, daemon=True)
        self.thread.start()

    def predict(self, x):
        with self.lock, torch.no_grad():
            return self.reference.model(x)

    def learn(self, x, y):
        self.queue.put((x, y))

    def _train(self):
        while not self.stopped:
            try:
                items = [self.queue.get(timeout=0.05)]
            except queue.Empty:
                continue
            deadline = time.perf_counter() + self.wait_s
            while sum(len(i[0]) for i in items) < self.batch:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    items.append(self.queue.get(timeout=left))
                except queue.Empty:
                    break
            x = torch.cat([i[0] for i in items])
            y = torch.cat([i[1] for i in items])
            with self.lock:
                self.reference.train_step(x, y)
                self.updates += 1
            for _ in items:
                self.queue.task_done()

    def close(self):
        self.queue.join()
        self.stopped = True
        self.thread.join()


def python_figures(model_path, events: int, batch: int, predictions: int, predict_threads: int,
                   feedback_threads: int) -> Dict[str, float]:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((events, FEATURES)).astype(np.float32))
    y = torch.from_numpy(rng.integers(CLASSES, size=events).astype(np.int64))
    chunks = [(x[i:i + batch], y[i:i + batch]) for i in range(0, events - batch + 1, batch)]
    one = x[:1]

    def latencies(service, total):
        out = [0.0] * total

        def worker(me):
            for i in range(me, total, predict_threads):
                started = time.perf_counter_ns()
                service.predict(one)
                out[i] = time.perf_counter_ns() - started
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(predict_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    figures: Dict[str, float] = {}
    service = PythonOnlineService(model_path, batch)
    latencies(service, predictions // 4)
    idle = latencies(service, predictions)
    stop = threading.Event()

    def feeder(me):
        i = me
        while not stop.is_set():
            try:
                service.queue.put(chunks[i], timeout=0.01)
            except queue.Full:
                continue
            i = (i + feedback_threads) % len(chunks)
    feeders = [threading.Thread(target=feeder, args=(t,)) for t in range(feedback_threads)]
    for f in feeders:
        f.start()
    before = service.updates
    busy = latencies(service, predictions)
    figures["updates_during_predictions"] = service.updates - before
    stop.set()
    for f in feeders:
        f.join()
    service.close()
    figures.update(predict_idle_p50_us=_percentile(idle, 0.5) / 1e3, predict_idle_p99_us=_percentile(idle, 0.99) / 1e3,
                   predict_training_p50_us=_percentile(busy, 0.5) / 1e3,
                   predict_training_p99_us=_percentile(busy, 0.99) / 1e3)

    service = PythonOnlineService(model_path, batch)
    started = time.perf_counter()
    for chunk in chunks:
        service.learn(*chunk)
    service.close()
    figures["online_events_per_s"] = len(chunks) * batch / (time.perf_counter() - started)

    reference = Reference(model_path)
    for chunk in chunks[:10]:
        reference.train_step(*chunk)  # warm-up
    started = time.perf_counter()
    for chunk in chunks:
        reference.train_step(*chunk)
    figures["fused_events_per_s"] = len(chunks) * batch / (time.perf_counter() - started)
    return figures


def run(events: int = 8192, batch: int = 32, predictions: int = 2000, predict_threads: int = 2,
        feedback_threads: int = 2, publish_every: int = 1, out_dir: str = "build/online-bench", out=print) -> int:
    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    model = export_builtin("mlp", out_path / "bench_mlp.pt", seed=0, in_features=FEATURES, hidden=(64,),
                           out_features=CLASSES, loss={"name": "cross_entropy"}, optimizer={"name": "adam", "lr": 1e-3},
                           inputs=[protocol.tensor_spec("x", [-1, FEATURES], "float32"),
                                   protocol.tensor_spec("y", [-1], "int64")])
    with tempfile.TemporaryDirectory(dir=out_path) as work:
        result = launcher.run("dev.gradbridge.bench.OnlineBenchmark",
                              [model, work, CLASSES, events, batch, predictions, predict_threads, feedback_threads,
                               publish_every])
    java = json.loads(result.stdout.strip().splitlines()[-1])
    python = python_figures(model, events, batch, predictions, predict_threads, feedback_threads)
    rows = []
    for label, figures in (("java OnlineLearner", java), ("python lock + thread", python)):
        p50 = figures["predict_training_p50_us"] / figures["predict_idle_p50_us"]
        p99 = figures["predict_training_p99_us"] / figures["predict_idle_p99_us"]
        throughput = figures["online_events_per_s"] / figures["fused_events_per_s"]
        rows.append((label, figures, p50, p99, throughput))
    out(f"MLP {FEATURES}-64-{CLASSES}, Adam, micro-batch {batch}, {events} events, {predictions} one-row predictions "
        f"from {predict_threads} threads, {feedback_threads} feedback threads; java publishes a version every "
        f"{publish_every} updates")
    out(f"{'':<22} {'predict p50 off/on (us)':>24} {'p99 off/on (us)':>20} {'p50 x':>6} {'p99 x':>6} "
        f"{'online ev/s':>12} {'batch ev/s':>11} {'ratio':>6}")
    for label, f, p50, p99, throughput in rows:
        out(f"{label:<22} {f['predict_idle_p50_us']:>11.0f}/{f['predict_training_p50_us']:<12.0f} "
            f"{f['predict_idle_p99_us']:>9.0f}/{f['predict_training_p99_us']:<10.0f} {p50:>6.2f} {p99:>6.2f} "
            f"{f['online_events_per_s']:>12.0f} {f['fused_events_per_s']:>11.0f} {throughput:>6.2f}")
    _, _, p50, p99, throughput = rows[0]
    out(f"goals (java): predict p99 with training <= 2x: {'met' if p99 <= 2 else 'NOT met'} ({p99:.2f}x); "
        f"throughput >= 0.8x fused: {'met' if throughput >= 0.8 else 'NOT met'} ({throughput:.2f}x)")
    path = out_path / "online-bench.json"
    path.write_text(json.dumps({"java": java, "python": python, "events": events, "batch": batch,
                                "publish_every": publish_every,
                                "predictions": predictions}, indent=2) + "\n")
    out(f"wrote {path}")
    return 0
