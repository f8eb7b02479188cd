"""Size: a decoder classifier with random weights and AdamW, exported, trained from Java and trained eagerly,
each phase in a child process of its own so its peak resident memory (the kernel's VmHWM, or the child
JVM's maxrss) is its own. Two families: GPT-2 (transformers' GPT2ForSequenceClassification, token ids
alone) and Llama (LlamaForSequenceClassification: grouped-query attention, SwiGLU, rotary positions; rows
of different lengths under an attention mask, padded, as fine-tuning batches come).

Phases: ``export`` (``export_training_module``: time, peak, file size, and the time to write that many bytes),
``eager`` (torch.optim, one step after a warm-up step), ``java`` (``gradbridge.java.train`` in this process: the
epoch's time per step), ``cli`` (``gradbridge-train --history`` in a JVM of its own), ``checkpoint``
(``java.train`` with a checkpoint: its time outside the epoch, less the same run's without one). The epoch
losses of java and cli are compared bit for bit (the export's check compared the module with the eager model).

    python benchmarks/size_bench.py                      # ~124M parameters (GPT-2 small: 12 layers, 768)
    python benchmarks/size_bench.py --params 45M          # the quick stand-in (6 layers, 512)
    python benchmarks/size_bench.py --params llama-28M    # the Llama stand-in (4 layers, 512)
    python benchmarks/size_bench.py --params llama-316M   # the size case: Llama, 24 layers, 1024 (~14 GB free)
    python benchmarks/size_bench.py --params 355M         # GPT-2 medium (24 layers, 1024)
    python benchmarks/size_bench.py --layers 20 --embd 1280 --heads 20   # ~450M GPT-2, any size by hand
    python benchmarks/size_bench.py --phases export,eager --format export

Options: --steps (4) batches of --batch (2) rows of --tokens (64) tokens, one epoch; --format (auto).
Check ``free -g`` first: the export peaks at about 1.1x eager training (the user's model, then one side of
the export's check at a time).
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

#: --params presets: (family, layers, width, heads); Llama's MLP is 2.75x its width, its key/value heads half.
PRESETS = {"45M": ("gpt2", 6, 512, 8), "124M": ("gpt2", 12, 768, 12), "355M": ("gpt2", 24, 1024, 16),
           "470M": ("gpt2", 20, 1280, 20), "llama-28M": ("llama", 4, 512, 8), "llama-316M": ("llama", 24, 1024, 16)}
PHASES = ("export", "eager", "java", "cli", "checkpoint")
#: Llama's vocabulary (Llama 2's), its padding and first ordinary token ids.
LLAMA_VOCAB, PAD, FIRST_TOKEN = 32000, 1, 3


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def build(args):
    import torch
    import transformers as hf
    torch.manual_seed(0)
    if args.family == "llama":
        config = hf.LlamaConfig(vocab_size=LLAMA_VOCAB, hidden_size=args.embd, intermediate_size=args.embd * 11 // 4,
                                num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                num_key_value_heads=max(1, args.heads // 2), max_position_embeddings=max(args.tokens, 64),
                                num_labels=2, pad_token_id=PAD)
        return _wrapped(hf.LlamaForSequenceClassification(config), masked=True)
    config = hf.GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, n_positions=max(args.tokens, 64),
                           num_labels=2, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return _wrapped(hf.GPT2ForSequenceClassification(config), masked=False)


def _wrapped(model, masked: bool):
    import torch

    class Logits(torch.nn.Module):
        """The classifier's logits alone (the loss takes one tensor), from token ids."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).logits

    class MaskedLogits(Logits):
        """The same from token ids and their attention mask (rows padded after their last token)."""

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    return (MaskedLogits if masked else Logits)(model)


def data(args):
    """(x, y): x the token ids (GPT-2), or ids and attention mask by name (Llama: rows of tokens/2 to tokens
    tokens, then padding)."""
    import numpy as np
    g = np.random.default_rng(0)
    n = args.steps * args.batch
    y = g.integers(0, 2, n).astype(np.int64)
    if args.family != "llama":
        return g.integers(1, 50257, (n, args.tokens)).astype(np.int64), y
    ids = g.integers(FIRST_TOKEN, LLAMA_VOCAB, (n, args.tokens)).astype(np.int64)
    lengths = g.integers(args.tokens // 2, args.tokens + 1, n)
    mask = (np.arange(args.tokens)[None, :] < lengths[:, None]).astype(np.int64)
    ids[mask == 0] = PAD
    return {"input_ids": ids, "attention_mask": mask}, y


def _rows(x, rows):
    import torch
    if isinstance(x, dict):
        return {name: torch.from_numpy(a[rows]) for name, a in x.items()}
    return torch.from_numpy(x[rows])


def _call(model, x):
    return model(**x) if isinstance(x, dict) else model(x)


OPTIMIZER = {"name": "adamw", "lr": 1e-4}


def phase(args) -> dict:
    """One phase, in this (child) process."""
    import torch
    from gradbridge import export_training_module, java, protocol
    x, y = data(args)
    model_path = os.path.join(args.folder, "model.pt")
    if args.phase == "export":
        model = build(args)
        started = time.perf_counter()
        export_training_module(model, "cross_entropy", OPTIMIZER, model_path, format=args.format,
                               example_inputs=(_rows(x, slice(0, args.batch)), torch.from_numpy(y[:args.batch])))
        seconds = time.perf_counter() - started
        kind = protocol.read_metadata(model_path)[protocol.CAPTURE_KEY]["kind"]
        started = time.perf_counter()  # writing the file's bytes once more: the write time's stand-in
        shutil.copyfile(model_path, model_path + ".copy")
        write_s = time.perf_counter() - started
        os.remove(model_path + ".copy")
        return {"s": seconds, "write_s": write_s, "file_mb": os.path.getsize(model_path) / 2**20,
                "params_m": sum(p.numel() for p in model.parameters()) / 1e6, "kind": kind}
    if args.phase == "eager":
        model = build(args).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIMIZER["lr"])
        ys = torch.from_numpy(y)
        times = []
        for k in range(2):
            rows = slice(k * args.batch, (k + 1) * args.batch)
            batch = _rows(x, rows)
            started = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(_call(model, batch), ys[rows]).backward()
            optimizer.step()
            times.append(time.perf_counter() - started)
        return {"step_s": times[-1]}
    if args.phase in ("java", "checkpoint"):
        checkpoint = os.path.join(args.folder, "run.pt") if args.phase == "checkpoint" else None
        started = time.perf_counter()
        history = java.train(model_path, x, y, epochs=1, batch_size=args.batch, mode="step", record_values=False,
                             checkpoint=checkpoint)
        seconds = time.perf_counter() - started
        result = {"s": seconds, "step_s": history[-1].elapsed_s / args.steps,
                  # the JVM's start, the module's load and (with one) the checkpoint's write
                  "outside_epoch_s": seconds - history[-1].elapsed_s, "losses": [float(v) for v in history.losses]}
        if checkpoint:
            result["checkpoint_mb"] = os.path.getsize(checkpoint) / 2**20
        return result
    if args.phase == "cli":
        import numpy as np
        from gradbridge import java as gj
        npz = os.path.join(args.folder, "train.npz")
        np.savez(npz, **(x if isinstance(x, dict) else {"x": x}), y=y)
        command = [os.path.join(os.path.dirname(gj.__file__), "..", "..", "build", "install", "gradbridge", "bin",
                                "gradbridge-train"),
                   "--model", model_path, "--data", npz, "--epochs", "1", "--batch-size", str(args.batch),
                   "--mode", "step", "--history", os.path.join(args.folder, "h.jsonl")]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if done.returncode:
            return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
        with open(os.path.join(args.folder, "h.jsonl")) as f:
            last = [json.loads(line) for line in f if line.strip()][-1]
        return {"s": seconds, "step_s": last["elapsed_s"] / args.steps,
                "jvm_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, "losses": [last["loss"]]}
    raise SystemExit(f"unknown phase {args.phase}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="124M", choices=sorted(PRESETS))
    parser.add_argument("--layers", type=int)
    parser.add_argument("--embd", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--format", default="auto", choices=("auto", "torchscript", "export"))
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.family, layers, embd, heads = PRESETS[args.params]
    args.layers, args.embd, args.heads = args.layers or layers, args.embd or embd, args.heads or heads
    if args.phase:
        result = phase(args)
        result["peak_mb"] = peak_mb()
        print("RESULT " + json.dumps(result), flush=True)
        return
    folder = tempfile.mkdtemp(prefix="size_bench.")
    try:
        _phases(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the module and checkpoint: GBs at the size case


def _phases(args, folder: str) -> None:
    print(f"{'Llama' if args.family == 'llama' else 'GPT-2'} decoder: {args.layers} layers, width {args.embd}; "
          f"{args.steps} steps of {args.batch} x "
          f"{args.tokens} tokens; AdamW; format {args.format}; load average {os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    for name in args.phases.split(","):
        command = [sys.executable, __file__, "--phase", name, "--folder", folder, "--params", args.params,
                   "--layers", str(args.layers), "--embd", str(args.embd), "--heads", str(args.heads),
                   "--steps", str(args.steps), "--batch", str(args.batch), "--tokens", str(args.tokens),
                   "--format", args.format]
        done = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            print(f"{name}: failed (exit {done.returncode}): {tail}", flush=True)
            continue
        results[name] = result = json.loads(lines[-1][len("RESULT "):])
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in result.items() if k != "losses"), flush=True)
    eager, java_run = results.get("eager"), results.get("java")
    if eager and "export" in results:
        export = results["export"]
        print(f"export peak / eager peak: {export['peak_mb'] / eager['peak_mb']:.2f}; "
              f"(export time - write) / eager step: {(export['s'] - export['write_s']) / eager['step_s']:.1f}")
    if java_run and "checkpoint" in results:  # the time outside the epoch, less the same run's without one
        print(f"checkpoint write: {results['checkpoint']['outside_epoch_s'] - java_run['outside_epoch_s']:.2f} s")
    if java_run and "cli" in results and "losses" in results["cli"]:
        print(f"java and cli losses equal: {java_run['losses'] == results['cli']['losses']}")


if __name__ == "__main__":
    main()
