"""The online learner on transformer shapes, in this process: learning throughput against an eager Python
loop over the same micro-batches, publish time per version of a full and a LoRA model, predictor memory.

    PYTHONPATH=python .venv/bin/python benchmarks/online_models_bench.py [--rounds 5] [--events 1024] [--threads 1]
        [--parts throughput,publish,memory]

1. Throughput: an HF BERT classifier (hidden 64, 2 layers, dropout 0.1, 32 tokens with their attention mask,
   AdamW) learns ``--events`` events in micro-batches of 32 from one Python caller (``learn``, fsync never, a
   version every 10 updates), until every event is applied and published; the eager side runs the same
   micro-batches through the user's nn.Module and torch.optim, seeded alike. Rounds interleave; the ratio is
   Java's events/s over eager's, round by round (median, 95% bootstrap interval). Goal: >= 0.8x.
2. Publish time: a larger BERT (hidden 256, 4 layers, ~5M parameters) fully fine-tuned and with PEFT LoRA
   adapters (r 8 on query and value, the base frozen), a version per update: the training thread's snapshot
   and publish phases per version (``optTimePhases``). Goal: LoRA's <= 1/20 of the full model's.
3. Predictor memory: the process's resident memory after opening the learner with 1 and with 4 predictors, of the
   full model and of the LoRA model (whose predictors hold the training module's frozen base, not copies of it),
   each in a fresh process; and the size of the LoRA model's checkpoint (what training changed: the frozen base
   left out) against its module file.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO))

from gradbridge import export_training_module, online  # noqa: E402
from gradbridge._runtime import shuffle  # noqa: E402
from gradbridge.bench.stats import ratio_ci, verdict  # noqa: E402
from tests.models.zoo import TokenClassifier  # noqa: E402

ROWS, LENGTH, VOCAB, CLASSES = 32, 32, 1000, 3


def _bert(hidden: int, layers: int, lora: bool = False):
    import transformers as hf

    torch.manual_seed(0)
    config = hf.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                           intermediate_size=4 * hidden, vocab_size=VOCAB, max_position_embeddings=64, num_labels=CLASSES)
    model = hf.BertForSequenceClassification(config)
    if lora:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"],
                                                           modules_to_save=["classifier"]))
    return TokenClassifier(model)


def _batches(events: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (events, LENGTH)).astype(np.int64)
    mask = (np.arange(LENGTH)[None, :] < rng.integers(LENGTH // 2, LENGTH + 1, (events, 1))).astype(np.int64)
    y = rng.integers(0, CLASSES, events).astype(np.int64)
    return [({"input_ids": ids[i:i + ROWS], "attention_mask": mask[i:i + ROWS]}, y[i:i + ROWS])
            for i in range(0, events, ROWS)]


def _export(model, path: Path) -> Path:
    x, y = _batches(ROWS)[0]
    trainable = [p for p in model.parameters() if p.requires_grad]
    return export_training_module(model, "cross_entropy", torch.optim.AdamW(trainable, lr=1e-3), path,
                                  example_inputs=({k: torch.from_numpy(v) for k, v in x.items()}, torch.from_numpy(y)),
                                  format="torchscript")


def _java_rate(path: Path, batches, work: Path, seed: int) -> float:
    learner = online.open_learner(path, work / f"log-{time.monotonic_ns()}", max_batch=ROWS, max_wait_ms=2,
                                  publish_every=10, checkpoint_every=1_000_000, fsync="never", predictors=1)
    seconds = online.jclass("java.util.concurrent.TimeUnit").SECONDS
    try:
        start = time.perf_counter()
        for x, y in batches:
            online.learn(learner, x, y)
        assert learner.awaitIdle(600, seconds)
        elapsed = time.perf_counter() - start
    finally:
        learner.halt()  # no final checkpoint: not part of learning
    return len(batches) * ROWS / elapsed


def _eager_rate(batches, seed: int) -> float:
    """The user's own loop over the same micro-batches: nn.Module, AdamW, each micro-batch seeded as the learner's."""
    model = _bert(64, 2)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    tensors = [({k: torch.from_numpy(v) for k, v in x.items()}, torch.from_numpy(y)) for x, y in batches]
    start = time.perf_counter()
    for i, (x, y) in enumerate(tensors):
        torch.manual_seed(shuffle.step_seed(seed, i * ROWS))
        optimizer.zero_grad()
        loss_fn(model(**x), y).backward()
        optimizer.step()
    return len(batches) * ROWS / (time.perf_counter() - start)


def _publish_ms(path: Path, work: Path, versions: int = 12) -> float:
    learner = online.open_learner(path, work / f"pub-{time.monotonic_ns()}", max_batch=8, max_wait_ms=1,
                                  publish_every=1, checkpoint_every=1_000_000, fsync="never", predictors=1,
                                  time_phases=True)
    seconds = online.jclass("java.util.concurrent.TimeUnit").SECONDS
    try:
        for x, y in _batches(8 * versions, seed=3):
            for i in range(0, len(y), 8):
                online.learn(learner, {k: v[i:i + 8] for k, v in x.items()}, y[i:i + 8])
                assert learner.awaitIdle(600, seconds)  # one micro-batch, one version
        nanos = learner.phaseTimes().nanos()
        counts = learner.phaseTimes().counts()
        published = int(counts.get("publish"))
        return (int(nanos.get("snapshot")) + int(nanos.get("publish"))) / published / 1e6
    finally:
        learner.halt()


def _rss_mb() -> float:
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _predictor_mb(path: Path, work: Path, predictors: int) -> float:
    """A learner's resident memory with ``predictors``, measured in a fresh process (this one's allocator holds
    what the earlier parts freed)."""
    import subprocess

    log = work / f"mem-{path.stem}-{predictors}"
    out = subprocess.run([sys.executable, __file__, "--memory-of", str(path), str(log), str(predictors)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _measure_memory(path: str, log_dir: str, predictors: int) -> None:
    online.jclass("dev.gradbridge.TrainingModule")  # the JVM and libtorch, before the baseline
    before = _rss_mb()
    learner = online.open_learner(path, log_dir, predictors=predictors, fsync="never")
    try:
        print(_rss_mb() - before)
    finally:
        learner.halt()


def _checkpoint_bytes(path: Path, work: Path) -> int:
    """The size of the checkpoint a learner writes after a few versions (a version and a checkpoint per update)."""
    log = work / f"ckpt-{time.monotonic_ns()}"
    learner = online.open_learner(path, log, max_batch=8, max_wait_ms=1, publish_every=1, checkpoint_every=1,
                                  fsync="never", predictors=1)
    seconds = online.jclass("java.util.concurrent.TimeUnit").SECONDS
    try:
        for x, y in _batches(32, seed=3):
            for i in range(0, len(y), 8):
                online.learn(learner, {k: v[i:i + 8] for k, v in x.items()}, y[i:i + 8])
                assert learner.awaitIdle(600, seconds)
    finally:
        learner.close()
    (checkpoint,) = log.glob("checkpoint-v*.pt")
    return checkpoint.stat().st_size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of both sides (default 1: on a loaded 2-core machine more threads"
                             " than free cores make OpenMP's parallel regions wait for descheduled threads)")
    parser.add_argument("--out", default=str(REPO / "build" / "online-bench" / "online-models.json"))
    parser.add_argument("--parts", default="throughput,publish,memory",
                        help="which parts to run, comma-separated (default: all three)")
    parser.add_argument("--memory-of", nargs=3, help=argparse.SUPPRESS)  # MODEL LOG PREDICTORS: part 3's subprocess
    args = parser.parse_args(argv)
    if args.memory_of:
        _measure_memory(args.memory_of[0], args.memory_of[1], int(args.memory_of[2]))
        return 0
    torch.set_num_threads(args.threads)
    online.jclass("dev.gradbridge.internal.ModuleAccess").setIntraOpThreads(args.threads)
    result = {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        parts = set(args.parts.split(","))
        small = _export(_bert(64, 2), work / "bert.pt")
        batches = _batches(args.events)
        java, eager = [], []
        for r in range(args.rounds if "throughput" in parts else 0):
            java.append(_java_rate(small, batches, work, 0))
            eager.append(_eager_rate(batches, 0))
            print(f"round {r + 1}: java {java[-1]:.0f} events/s, eager {eager[-1]:.0f} events/s", flush=True)
        if java:
            ci = ratio_ci(java, eager)
            result["throughput"] = {"java": java, "eager": eager, **ci}
            print(f"throughput: java/eager {ci['ratio']:.2f}x [{ci['ci95'][0]:.2f}, {ci['ci95'][1]:.2f}]; goal >= 0.8x: "
                  f"{verdict([1 / ci['ci95'][1], 1 / ci['ci95'][0]], 1 / 0.8)}")

        full = _export(_bert(256, 4), work / "full.pt")
        lora = _export(_bert(256, 4, lora=True), work / "lora.pt")
        if "publish" in parts:
            full_ms = [_publish_ms(full, work) for _ in range(max(2, args.rounds // 2))]
            lora_ms = [_publish_ms(lora, work) for _ in range(max(2, args.rounds // 2))]
            ratio = float(np.median(lora_ms) / np.median(full_ms))
            result["publish_ms"] = {"full": full_ms, "lora": lora_ms, "lora_over_full": ratio}
            print(f"publish per version: full {np.median(full_ms):.2f} ms {[round(v, 2) for v in full_ms]}, "
                  f"LoRA {np.median(lora_ms):.3f} ms {[round(v, 3) for v in lora_ms]}: {ratio:.3f}x; goal <= 0.05x: "
                  f"{'met' if ratio <= 0.05 else 'missed'}")

        if "memory" in parts:
            result["predictor_mb"] = {}
            for name, path in (("full", full), ("lora", lora)):
                one, four = _predictor_mb(path, work, 1), _predictor_mb(path, work, 4)
                size = path.stat().st_size / 2**20
                result["predictor_mb"][name] = {"one": one, "four": four, "module_file_mb": size}
                print(f"resident memory of a learner, {name}: 1 predictor +{one:.0f} MB, 4 predictors +{four:.0f} MB "
                      f"({(four - one) / 3:.1f} MB a predictor; the module file {size:.1f} MB)")
            checkpoint = _checkpoint_bytes(lora, work)
            result["lora_checkpoint_bytes"] = {"checkpoint": checkpoint, "module_file": lora.stat().st_size}
            print(f"LoRA checkpoint: {checkpoint / 2**20:.2f} MB, the module file {lora.stat().st_size / 2**20:.2f} MB")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
