"""The benchmark behind `gradbridge online-bench`: the online learner's two figures, and the same for the service a
Python team would otherwise write, side by side, in one run.

1. predict p50/p99 latency with training running and with training off (targets: p50 no slower
   than the Python service's, p99 under 1 ms with training on);
2. learning throughput (events applied per second) vs the fused ``train_epoch`` at the same
   micro-batch size (targets: at least 0.8x with fsync never, 0.5x with fsync always).

Java: ``dev.gradbridge.bench.OnlineBenchmark`` in a JVM of its own. Throughput in interleaved
rounds on the same events and micro-batch size: the OnlineLearner fed by ``feeders`` concurrent
clients, each waiting for its own acknowledgement (log written; fsync never, and fsync always, the
default policy, whose group commit lets one fsync acknowledge the micro-batches that arrived
meanwhile; loss validation off) against the Trainer in step mode (one
``train_step`` call per micro-batch: the like-for-like) and the fused ``train_epoch`` (one call
for all micro-batches), with the learner's time per phase. Python: one eager model
behind a lock, a training thread taking micro-batches from a queue (torch.optim), predictions
under the same lock (the usual shape of such a service); against a plain ``for`` loop of
torch.optim steps. Both are measured as libraries, without HTTP in front.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

from .._runtime import launcher
from .. import protocol
from ..errors import GradbridgeError
from ..export import export_builtin
from .._runtime.files import atomic_path
from ..reference import Reference

CLASSES = 4
FEATURES = 16
#: Concurrent clients feeding the Java learner in the throughput rounds, each waiting for its
#: acknowledgement: a service has many (4, as the fault suite's concurrent cases; more threads
#: only compete for this machine's 2 cores); 1 is a single synchronous client, where every
#: micro-batch waits for an fsync of its own under fsync always.
FEEDERS = 4
#: Feedback events per throughput round: at ~60,000 events/s a round of 8,192 lasted ~0.14 s, and
#: the fused epoch's own rate moved 1.5x between such rounds on a quiet machine; longer rounds
#: average the machine's moments out of the per-round ratios.
EVENTS = 32768
#: Predictions before the timed ones, on each side, from the same threads: the JVM compiles a method
#: with C2 after ~10,000 calls, and fewer left the timed Java calls partly interpreted (p50 ~2x).
PREDICT_WARMUP = 20_000


def _percentile(values, q):
    return float(np.sort(np.asarray(values))[min(len(values) - 1, int(np.floor(q * (len(values) - 1) + 0.5)))])


def _latency_figures(idle, busy) -> Dict:
    """p50/p99 in us pooled over the rounds' samples (ns), and per round, in the Java side's keys."""
    figures: Dict = {}
    by_round: Dict[str, list] = {}
    for when, samples in (("idle", idle), ("training", busy)):
        pooled = [v for sample in samples for v in sample]
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            figures[f"predict_{when}_{name}_us"] = _percentile(pooled, q) / 1e3
            by_round[f"{when}_{name}_us"] = [_percentile(sample, q) / 1e3 for sample in samples]
    figures["predict_by_round"] = by_round
    return figures


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
                   feedback_threads: int, rounds: int = 5) -> Dict:
    """The Python service's figures, with one torch compute thread (as the Java side), restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _python_figures(model_path, events, batch, predictions, predict_threads, feedback_threads, rounds)
    finally:
        torch.set_num_threads(threads)


def _python_figures(model_path, events: int, batch: int, predictions: int, predict_threads: int,
                    feedback_threads: int, rounds: int) -> Dict:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((events, FEATURES)).astype(np.float32))
    y = torch.from_numpy(rng.integers(CLASSES, size=events).astype(np.int64))
    chunks = [(x[i:i + batch], y[i:i + batch]) for i in range(0, events - batch + 1, batch)]
    one = x[:1]

    figures: Dict = {}
    service = PythonOnlineService(model_path, batch)
    _latencies(service, one, PREDICT_WARMUP, predict_threads)
    idle, busy, updates = _prediction_samples(service, chunks, one, predictions, predict_threads, feedback_threads,
                                              rounds)
    service.close()
    figures["updates_during_predictions"] = updates
    figures.update(_latency_figures(idle, busy))
    rates = _event_rates(model_path, chunks, batch, rounds)
    figures["events_per_s_by_round"] = rates
    figures["online_events_per_s"] = float(np.median(rates["online"]))
    figures["fused_events_per_s"] = float(np.median(rates["loop"]))
    return figures


#: The Java variants of the throughput comparison, in the JSON's names, with what each one is.
JAVA_VARIANTS = (
    ("online_never", "OnlineLearner, fsync never", "learn() -> log (written) -> queue -> train_step -> version"),
    ("online_always", "OnlineLearner, fsync always", "the same, fsync before ack and before each version (the default)"),
    ("trainer_step", "Trainer, step mode", "one train_step call per micro-batch (the like-for-like)"),
    ("fused_epoch", "fused train_epoch", "one native call for all micro-batches"),
)


def _latencies(service, one, total: int, predict_threads: int) -> List[float]:
    """``total`` predictions of ``one`` on ``predict_threads`` threads: each one's nanoseconds."""
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


def _prediction_samples(service, chunks, one, predictions: int, predict_threads: int, feedback_threads: int,
                        rounds: int) -> Tuple[list, list, list]:
    """Per round, the prediction latencies idle and with ``feedback_threads`` feeding training, and the
    updates made meanwhile. As the Java side: an idle sample, then one with training on, per round; round -1
    untimed, as long as the warm-up."""
    def feeder(me, stop):
        i = me
        while not stop.is_set():
            try:
                service.queue.put(chunks[i], timeout=0.01)
            except queue.Full:
                continue
            i = (i + feedback_threads) % len(chunks)

    idle, busy, updates = [], [], []
    for r in range(-1, rounds):
        calls = max(predictions, PREDICT_WARMUP) if r < 0 else predictions
        idle_sample = _latencies(service, one, calls, predict_threads)
        stop = threading.Event()
        feeders = [threading.Thread(target=feeder, args=(t, stop)) for t in range(feedback_threads)]
        for f in feeders:
            f.start()
        before = service.updates
        busy_sample = _latencies(service, one, calls, predict_threads)
        during = service.updates - before
        stop.set()
        for f in feeders:
            f.join()
        service.queue.join()
        if r >= 0:
            idle.append(idle_sample)
            busy.append(busy_sample)
            updates.append(during)
    return idle, busy, updates


def _event_rates(model_path, chunks, batch: int, rounds: int) -> Dict[str, list]:
    """Events per second by round: the online service learning every chunk, and a plain loop of eager
    train_step over them; interleaved rounds, the order alternating, as on the Java side."""
    def online_round():
        service = PythonOnlineService(model_path, batch)
        for chunk in chunks[:16]:  # warm-up
            service.learn(*chunk)
        service.queue.join()
        started = time.perf_counter()
        for chunk in chunks:
            service.learn(*chunk)
        service.close()
        return len(chunks) * batch / (time.perf_counter() - started)

    reference = Reference(model_path)
    for chunk in chunks[:10]:
        reference.train_step(*chunk)  # warm-up

    def loop_round():
        started = time.perf_counter()
        for chunk in chunks:
            reference.train_step(*chunk)
        return len(chunks) * batch / (time.perf_counter() - started)

    rates: Dict[str, list] = {"online": [], "loop": []}
    for r in range(rounds):
        for name in (("online", "loop") if r % 2 == 0 else ("loop", "online")):
            rates[name].append(online_round() if name == "online" else loop_round())
    return rates


def java_figures(model, work, events: int, batch: int, predictions: int, predict_threads: int,
                 feedback_threads: int, publish_every: int, rounds: int, feeders: int = FEEDERS) -> Dict:
    """``OnlineBenchmark`` in a JVM of its own, one libtorch compute thread for every variant.

    ``OMP_NUM_THREADS=1``: on a shared machine, libtorch's OpenMP teams stall whenever a team
    thread is descheduled; which variant a stall hits is chance (it moved 10x between rounds), and
    this model gains nothing from a second thread. The same setting for all variants.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    main = "dev.gradbridge.bench.OnlineBenchmark"
    result = subprocess.run(launcher.command(main, [model, work, CLASSES, events, batch, predictions, predict_threads,
                                                    feedback_threads, publish_every, rounds,
                                                    ",".join(v[0] for v in JAVA_VARIANTS), feeders,
                                                    PREDICT_WARMUP if predictions > 0 else 0]),
                            capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise GradbridgeError(f"OnlineBenchmark (separate JVM) failed: "
                              f"{launcher.error_line(result.stderr, result.returncode)}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def command_line(events: int, batch: int, predictions: int, publish_every: int, rounds: int, feeders: int) -> str:
    """The command that reproduces a run (printed and kept in the JSON)."""
    return (f"gradbridge online-bench --events {events} --batch {batch} --predictions {predictions} "
            f"--publish-every {publish_every} --rounds {rounds} --feeders {feeders}")


def measure(events: int = EVENTS, batch: int = 32, predictions: int = 2000, predict_threads: int = 2,
            feedback_threads: int = 2, publish_every: int = 1, rounds: int = 5,
            out_dir: str | os.PathLike = "build/online-bench", feeders: int = FEEDERS) -> Dict:
    """Both services' figures on the bench MLP, written to ``out_dir/online-bench.json`` (its ``path``)."""
    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    model = export_builtin("mlp", out_path / "bench_mlp.pt", seed=0, in_features=FEATURES, hidden=(64,),
                           out_features=CLASSES, loss={"name": "cross_entropy"}, optimizer={"name": "adam", "lr": 1e-3},
                           inputs=[protocol.tensor_spec("x", [-1, FEATURES], "float32"),
                                   protocol.tensor_spec("y", [-1], "int64")])
    with tempfile.TemporaryDirectory(dir=out_path) as work:
        java = java_figures(model, work, events, batch, predictions, predict_threads, feedback_threads,
                            publish_every, rounds, feeders)
    python = python_figures(model, events, batch, predictions, predict_threads, feedback_threads, rounds)
    figures = {"java": java, "python": python, "events": events, "batch": batch, "publish_every": publish_every,
               "rounds": rounds, "feeders": feeders,
               "command": command_line(events, batch, predictions, publish_every, rounds, feeders),
               "predictions": predictions, "predict_warmup": PREDICT_WARMUP,
               "load_average": {"start": list(load_start), "end": list(os.getloadavg())}}
    path = out_path / "online-bench.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(figures, indent=2) + "\n")
    return {**figures, "path": path}
