"""The `gradbridge` command line (also `python -m gradbridge`): parses arguments and hands each
command to its module in this package; errors become one ``error:`` line and exit 1."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Dict, List, Optional

from .. import messages, protocol
from ..errors import CLI_ERROR_PREFIX, GradbridgeError
from .._runtime.files import check_writable
from ..models import BUILTIN_MODELS, SEED_LR
from ..parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL

# Optimizer and loss flags: only those given are passed, so each class keeps its own defaults.
_OPTIMIZER_FLAGS = ("lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize", "betas", "eps",
                    "amsgrad", "alpha", "centered", "lr_decay", "initial_accumulator_value")
_LOSS_FLAGS = ("reduction", "beta", "delta", "label_smoothing", "ignore_index", "class_weights", "pos_weight")


def _floats(text: str) -> List[float]:
    return [float(v) for v in text.split(",") if v.strip()]


_floats.__name__ = "list (comma-separated numbers)"


def _tolerance(text: str) -> float:
    """A tolerance: a finite number >= 0 (argparse turns ValueError into one usage line)."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return value


_tolerance.__name__ = "tolerance (a finite number >= 0)"


def _shape(text: str) -> List[int]:
    """``4`` or ``1,8,8``: positive integers (argparse names the option when this raises)."""
    values = [int(v) for v in text.split(",") if v.strip()]
    if any(v < 1 for v in values):
        raise ValueError(text)
    return values


_shape.__name__ = "shape (comma-separated positive integers)"


def _milestones(text: str) -> List[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values:
        raise ValueError(text)
    return values


_milestones.__name__ = "milestones (comma-separated integers)"


def _given(args: argparse.Namespace, flags) -> Dict[str, Any]:
    return {flag: getattr(args, flag) for flag in flags if getattr(args, flag) is not None}


def _export(args: argparse.Namespace) -> int:
    from ..export.command_line import export_from_options

    path = export_from_options(
        args.model, args.output, seed=args.seed, op_libraries=args.op_library,
        optimizer={"name": args.optimizer, **_given(args, _OPTIMIZER_FLAGS)}, groups=args.group or [],
        loss_name=args.loss, loss=_given(args, _LOSS_FLAGS), input_shape=args.input_shape,
        input_dtype=args.input_dtype, target_shape=args.target_shape, target_dtype=args.target_dtype,
        freeze=args.freeze, accumulate=args.accumulate, schedulers=args.scheduler or [], milestones=args.milestones,
        scheduler_interval=args.scheduler_interval, clip_norm=args.clip_norm, clip_norm_type=args.clip_norm_type,
        clip_value=args.clip_value, init_weights=args.init_weights, check=args.check, format=args.format)
    capture = protocol.read_metadata(path).get(protocol.CAPTURE_KEY, {})
    print(f"wrote {path} ({messages.format_chosen(capture.get('kind', ''), protocol.AUTO_REASON_KEY in capture)})")
    return 0


def _state_dict(args: argparse.Namespace) -> int:
    from ..export import save_state_dict

    print(f"wrote {save_state_dict(args.module, args.output, base=args.base)}")
    return 0


def _parity(args: argparse.Namespace) -> int:
    from .parity import run

    return run(args.model, args.data, val_path=args.val, epochs=args.epochs, batch_size=args.batch_size,
               seed=args.seed, mode=args.mode, java_mode=args.java, rtol=args.rtol, atol=args.atol,
               report_path=args.report, plot_path=args.plot, op_libraries=args.op_library,
               model_factory=args.model_factory, device=args.device)


def _build_op(args: argparse.Namespace) -> int:
    from .._runtime import ops

    check_writable(args.output)
    print(f"wrote {ops.build(args.sources, args.output)}")
    return 0


def _gradcheck(args: argparse.Namespace) -> int:
    from .gradcheck import run

    return run(args.model, args.data, batch_size=args.batch_size, op_libraries=args.op_library,
               max_elements=args.max_elements, report_path=args.report, model_factory=args.model_factory)


def _op_library_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op-library", action="append", default=[], metavar="FILE",
                        help="custom-operator library to load first (repeatable); never taken from the .pt")


def _bench(args: argparse.Namespace) -> int:
    from .bench import run

    return run(quick=args.quick, out_dir=args.out_dir, rounds=args.rounds, cases=args.cases, only=args.only,
               steps_only=args.steps_only, java_options=args.java_option, java_env=dict(args.java_env),
               java_cpus=args.java_cpus, threads=args.threads, memory_steps=args.memory_steps)


#: `gradbridge bench --cases/--only` names (bench.cases.CASES keys, VARIANTS + IN_PROCESS keys; a test
#: checks they agree), here so that the parser does not import torch.
BENCH_CASES = ("seed", "mlp", "big", "resnet18", "transformer", "lstm")
BENCH_VARIANTS = ("a", "b", "c", "d", "e", "e'", "d3", "c*", "d*", "d3*")


def _bench_rounds(text: str) -> int:
    value = int(text)
    if not 2 <= value <= 10_000:
        raise ValueError(text)
    return value


_bench_rounds.__name__ = messages.BENCH_ROUNDS


def _bench_threads(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 1024:
        raise ValueError(text)
    return value


_bench_threads.__name__ = messages.BENCH_THREADS

#: `gradbridge online-bench --feeders` default (bench.online.FEEDERS; a test checks they agree), here
#: so that the parser does not import torch.
ONLINE_BENCH_FEEDERS = 4
#: `gradbridge online-bench --events` default (bench.online.EVENTS; the same test checks them).
ONLINE_BENCH_EVENTS = 32768


def _memory_steps(text: str) -> int:
    value = int(text)
    if not 100 <= value <= 100_000_000:
        raise ValueError(text)
    return value


_memory_steps.__name__ = "step count (an integer from 100 to 100000000)"


def _choices(allowed, what: str):
    def parse(text: str) -> List[str]:
        chosen = [item.strip() for item in text.split(",") if item.strip()]
        if not chosen or any(item not in allowed for item in chosen):
            raise ValueError(text)
        return chosen
    parse.__name__ = messages.bench_choice(what, allowed)
    return parse


def _env_assignment(text: str):
    name, equals, value = text.partition("=")
    if not equals or not name or not name.replace("_", "a").isalnum():
        raise ValueError(text)
    return name, value


_env_assignment.__name__ = messages.ENV_ASSIGNMENT


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(epochs=args.epochs, out_dir=args.out_dir)


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import run

    return run()


def _verify(args: argparse.Namespace) -> int:
    from .verify import run

    return run()


def _replay(args: argparse.Namespace) -> int:
    from .replay import run

    return run(args.log, args.model, gate_data=args.gate_data, model_factory=args.model_factory,
               from_kafka=args.from_kafka, kafka_bootstrap=args.kafka_bootstrap, kafka_topic=args.kafka_topic,
               kafka_properties=args.kafka_properties)


def _serve(args: argparse.Namespace) -> int:
    from .serve import run

    return run(args.args)


def _recover_log(args: argparse.Namespace) -> int:
    from .replay import run_recover

    return run_recover(args.log, args.into)


def _online_demo(args: argparse.Namespace) -> int:
    from .online_demo import run

    return run(rounds=args.rounds, batch=args.batch, out_dir=args.out_dir, model=args.model)


def _online_bench(args: argparse.Namespace) -> int:
    from .online_bench import run

    return run(events=args.events, batch=args.batch, predictions=args.predictions, publish_every=args.publish_every,
               rounds=args.rounds, out_dir=args.out_dir, feeders=args.feeders)


class _Parser(argparse.ArgumentParser):
    """argparse with gradbridge's convention for bad input: one line, exit code 1 (not usage + 2)."""

    def error(self, message: str):
        self.exit(1, f"{CLI_ERROR_PREFIX}{message} (see {self.prog} --help)\n")


def _export_input_options(parser: argparse.ArgumentParser) -> None:
    """`export`'s per-sample input and target shapes and dtypes."""
    shapes = parser.add_argument_group("inputs (per sample; the batch dimension is implied)")
    shapes.add_argument("--input-shape", type=_shape, help="e.g. 4 or 1,8,8 (default 1; sizes a built-in model)")
    shapes.add_argument("--input-dtype", default="float32", choices=("float32", "float64", "int64"),
                        help="int64 for index inputs (embeddings); default float32")
    shapes.add_argument("--target-shape", type=_shape,
                        help="default: none for class-index losses, else 1 (sizes a built-in model's output)")
    shapes.add_argument("--target-dtype", choices=("float32", "float64", "int64"),
                        help="default: int64 for cross_entropy/nll, else float32")


def _export_loss_options(parser: argparse.ArgumentParser) -> None:
    """`export`'s loss and its arguments (only those given are passed)."""
    loss = parser.add_argument_group("loss")
    loss.add_argument("--loss", help="mse (default), l1, smooth_l1, huber, cross_entropy, nll, bce_with_logits")
    loss.add_argument("--reduction", choices=("mean", "sum"))
    loss.add_argument("--beta", type=float, help="smooth_l1 beta")
    loss.add_argument("--delta", type=float, help="huber delta")
    loss.add_argument("--label-smoothing", type=float)
    loss.add_argument("--ignore-index", type=int)
    loss.add_argument("--class-weights", type=_floats, help="comma-separated, one per class")
    loss.add_argument("--pos-weight", type=_floats, help="comma-separated, bce_with_logits")


def _export_optimizer_options(parser: argparse.ArgumentParser) -> None:
    """`export`'s optimizer, its arguments and parameter groups."""
    opt = parser.add_argument_group("optimizer")
    opt.add_argument("--optimizer", default="sgd", help="sgd (default), adam, adamw, rmsprop, adagrad")
    opt.add_argument("--lr", type=float, help=f"learning rate (default: the optimizer's; {SEED_LR} for linear-regression)")
    opt.add_argument("--momentum", type=float)
    opt.add_argument("--dampening", type=float)
    opt.add_argument("--nesterov", action="store_true", default=None)
    opt.add_argument("--weight-decay", type=float)
    opt.add_argument("--maximize", action="store_true", default=None)
    opt.add_argument("--betas", type=float, nargs=2, metavar=("BETA1", "BETA2"))
    opt.add_argument("--eps", type=float)
    opt.add_argument("--amsgrad", action="store_true", default=None)
    opt.add_argument("--alpha", type=float, help="rmsprop smoothing constant")
    opt.add_argument("--centered", action="store_true", default=None)
    opt.add_argument("--lr-decay", type=float)
    opt.add_argument("--initial-accumulator-value", type=float)
    opt.add_argument("--group", action="append", metavar="PREFIX:KEY=VALUE,...",
                     help="a parameter group: parameters whose names start with PREFIX, with their own options "
                          "(e.g. backbone.:lr=1e-4,weight_decay=0; betas as 0.9|0.99); repeatable; the other "
                          "trainable parameters form the first group with the options above")


def _export_tuning_options(parser: argparse.ArgumentParser) -> None:
    """`export`'s fine-tuning: frozen prefixes, initial weights, schedules, clipping, accumulation."""
    tuning = parser.add_argument_group("fine-tuning")
    tuning.add_argument("--freeze", action="append", metavar="PREFIX",
                        help="freeze parameters whose names start with PREFIX (requires_grad=False); repeatable")
    tuning.add_argument("--init-weights", metavar="FILE",
                        help="start from this state_dict (torch.save file, read with weights_only=True)")
    tuning.add_argument("--scheduler", action="append", metavar="NAME:KEY=VALUE,...",
                        help="lr schedule: step, multistep, exponential, cosine, linear, onecycle, plateau with "
                             "torch's argument names (e.g. cosine:T_max=1000; milestones as 30|80); repeat it with "
                             "--milestones for a SequentialLR")
    tuning.add_argument("--milestones", type=_milestones, help="SequentialLR milestones, comma-separated (e.g. 100)")
    tuning.add_argument("--scheduler-interval", choices=("step", "epoch"),
                        help="step the schedule after every optimizer step (default) or every epoch")
    tuning.add_argument("--clip-norm", type=float, help="clip_grad_norm_ max norm before each step")
    tuning.add_argument("--clip-norm-type", type=float, help="2 (default) or inf")
    tuning.add_argument("--clip-value", type=float, help="clip_grad_value_ before each step")
    tuning.add_argument("--accumulate", type=int, default=1, metavar="K",
                        help="gradient accumulation: K micro-batches per optimizer step")


def _add_export(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export", help="export a training module (.pt)",
        description="Export MODEL (a built-in name, or MODULE:FACTORY returning an nn.Module) with its loss and "
                    "optimizer as a gradbridge training module.")
    export.add_argument("model", help=f"built-in ({', '.join(BUILTIN_MODELS)}) or MODULE:FACTORY")
    export.add_argument("-o", "--output", required=True, help="output .pt (written atomically)")
    export.add_argument("--seed", type=int, default=0, help="torch seed for the initial parameters (default 0)")
    _export_input_options(export)
    _export_loss_options(export)
    _export_optimizer_options(export)
    _export_tuning_options(export)
    export.add_argument("--format", choices=protocol.FORMATS, default=protocol.DEFAULT_FORMAT,
                        help="torchscript (protocol 2), export (protocol 3: torch.export op lists run by the native "
                             "layer), or auto (default): TorchScript where it captures the model and passes the "
                             "check, else protocol 3")
    export.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the check of the export against the eager model (two training steps and eval on "
                             "an example batch, bit for bit); only for a model too large to run twice")
    _op_library_option(export)
    export.set_defaults(run=_export)


def _add_state_dict(commands: argparse._SubParsersAction) -> None:
    state = commands.add_parser(
        "state-dict", help="turn an exported module or a Java checkpoint into a state_dict file",
        description="Write the model's state_dict held by MODULE (an export or a Java checkpoint: its current, "
                    "trained values) with torch.save; model.load_state_dict(torch.load(FILE, weights_only=True)) "
                    "takes it.")
    state.add_argument("module", help="exported module or checkpoint (.pt)")
    state.add_argument("-o", "--output", required=True, help="state_dict file to write")
    state.add_argument("--base", help="an online checkpoint's module file: the frozen tensors a .trained.pt leaves out")
    state.set_defaults(run=_state_dict)


def _add_parity(commands: argparse._SubParsersAction) -> None:
    parity = commands.add_parser(
        "parity", help="train with the Python reference and with Java, compare every epoch",
        description="Train MODEL.pt on the same data with eager PyTorch (torch.optim) and with the Java Trainer, "
                    "print a per-epoch table and say whether they agree. Exit code 0 only within tolerance.")
    parity.add_argument("model", help="exported training module (.pt)")
    parity.add_argument("--data", required=True, help=".npz with arrays x and y")
    parity.add_argument("--val", help=".npz with validation arrays x and y")
    parity.add_argument("--epochs", type=int, default=5)
    parity.add_argument("--batch-size", type=int, default=protocol.DEFAULT_BATCH_SIZE)
    parity.add_argument("--seed", type=int, default=protocol.DEFAULT_SEED)
    parity.add_argument("--mode", choices=protocol.MODES, default=protocol.DEFAULT_MODE)
    parity.add_argument("--java", choices=("inprocess", "subprocess", "both"), default="inprocess",
                        help="in this process through JPype (exact), a separate JVM, or both")
    parity.add_argument("--rtol", type=_tolerance,
                        help=f"relative tolerance (default: 0 in-process, {SEPARATE_JVM_RTOL:g} subprocess)")
    parity.add_argument("--atol", type=_tolerance,
                        help=f"absolute tolerance (default: 0 in-process, {SEPARATE_JVM_ATOL:g} subprocess)")
    parity.add_argument("--model-factory", metavar="MODULE:FACTORY",
                        help="your own nn.Module (a function returning it) for the eager side, started from the "
                             "module's initial tensors (default: the model stored in the .pt)")
    parity.add_argument("--device", default="cpu",
                        help="train both sides on cpu, cuda or cuda:N (default: cpu); on CUDA with torch's "
                             "deterministic algorithms and CUBLAS_WORKSPACE_CONFIG=:4096:8")
    parity.add_argument("--report", help="write every figure as JSON here")
    parity.add_argument("--plot", help="write loss curves and |difference| per epoch as PNG here")
    _op_library_option(parity)
    parity.set_defaults(run=_parity)


def _add_build_op(commands: argparse._SubParsersAction) -> None:
    build_op = commands.add_parser(
        "build-op", help="compile C++ custom operators into a library (g++, CPU, this torch)",
        description="Compile C++ sources that register operators with TORCH_LIBRARY into a shared library, "
                    "against this Python's libtorch (torch.utils.cpp_extension, no CUDA toolkit).")
    build_op.add_argument("sources", nargs="+", help="C++ source files")
    build_op.add_argument("-o", "--output", required=True, help="the library to write, e.g. build/ops/libmyops.so")
    build_op.set_defaults(run=_build_op)


def _add_gradcheck(commands: argparse._SubParsersAction) -> None:
    gradcheck = commands.add_parser(
        "gradcheck", help="check the gradients Java computes, and the model's gradients by finite differences",
        description="On one batch: the gradients Java computes (calculate_loss_and_backward, get_gradients) "
                    "against Python autograd on the same module (bitwise), and every parameter's analytic "
                    "gradient against float64 central finite differences. Exit code 0 only when both pass.")
    gradcheck.add_argument("model", help="exported training module (.pt)")
    gradcheck.add_argument("--data", required=True, help=".npz with arrays x and y (the first batch is used)")
    gradcheck.add_argument("--batch-size", type=int, default=8, help="samples in the checked batch (default 8)")
    gradcheck.add_argument("--max-elements", type=int, default=64,
                           help="finite differences for at most this many elements per parameter (default 64)")
    gradcheck.add_argument("--model-factory", metavar="MODULE:FACTORY",
                           help="your own nn.Module (a function returning it) for the finite differences, started "
                                "from the module's initial tensors (needed for a protocol-3 module, which stores none)")
    gradcheck.add_argument("--report", help="write every figure as JSON here")
    _op_library_option(gradcheck)
    gradcheck.set_defaults(run=_gradcheck)


def _add_bench(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="time Java-driven training against eager Python and native libtorch")
    bench.add_argument("--quick", action="store_true", help="few rounds, small sizes, no gradle run (for tests)")
    bench.add_argument("--rounds", type=_bench_rounds,
                       help="interleaved rounds per model (default 15, --quick 3): more rounds, narrower intervals")
    bench.add_argument("--out-dir", default="build/bench",
                       help="where bench.json, bench.png and the exported modules go (the native loop: build/bench-native)")
    bench.add_argument("--cases", type=_choices(BENCH_CASES, "models"), default=[],
                       help="models, comma-separated: seed (linear regression), mlp (32-64-64-10), "
                            "big (512-1024-512-10), resnet18 (torchvision's, 32x32 images), "
                            "transformer (2-layer encoder, d=128, seq 64), lstm (2 layers, hidden 128); default: all")
    bench.add_argument("--only", type=_choices(BENCH_VARIANTS, "variants"), default=[],
                       help="variants, comma-separated: " + ", ".join(BENCH_VARIANTS) + " (see benchmarks/README.md)")
    bench.add_argument("--threads", type=_bench_threads,
                       help="intra-op threads of every variant (default: torch's, one per core)")
    bench.add_argument("--memory-steps", type=_memory_steps,
                       help="steps of each resident-memory run (default 200,000: past the ~100,000-step warm-up; "
                            "--quick 1,000)")
    bench.add_argument("--steps-only", action="store_true", help="only the training-step table (no call "
                                                                  "breakdown, transfer, memory, start-up)")
    own = bench.add_argument_group("the own-JVM variants (c), (d): one factor at a time")
    own.add_argument("--java-option", action="append", default=[], metavar="OPTION",
                     help="extra JVM option, e.g. -XX:+UseSerialGC (repeatable)")
    own.add_argument("--java-env", action="append", type=_env_assignment, default=[], metavar="NAME=VALUE",
                     help="environment variable for the JVM, e.g. OMP_WAIT_POLICY=passive (repeatable)")
    own.add_argument("--java-cpus", metavar="LIST", help="run the JVM on these CPUs (taskset -c LIST)")
    bench.set_defaults(run=_bench)


def _add_demo(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser("demo", help="export, train from Java (gradle run and in-process), check parity")
    demo.add_argument("--epochs", type=int, default=1000, help="epochs (default 1000)")
    demo.add_argument("--out-dir", default="build/demo", help="where models and histories go")
    demo.set_defaults(run=_demo)


def _add_replay(commands: argparse._SubParsersAction) -> None:
    replay = commands.add_parser(
        "replay", help="replay an online learner's feedback log with eager PyTorch, check every version",
        description="Apply the micro-batches logged by dev.gradbridge.online.OnlineLearner to MODEL's initial "
                    "tensors with eager torch.optim and compare every published version bit for bit. Exit code 0 "
                    "only when all match.")
    replay.add_argument("--log", required=True, help="the learner's log folder (holds feedback.log)")
    replay.add_argument("--model", required=True, help="the exported training module the learner started from")
    replay.add_argument("--gate-data", help="a gated log's gate data (default: the file its header names, when it is "
                                            "unchanged): each gate loss is computed again and compared bit for bit")
    replay.add_argument("--from-kafka", action="store_true",
                        help="read the events a Kafka-fed log learned from again from the topic (the offsets the log "
                             "names) and replay those; a topic that holds other records is an error")
    replay.add_argument("--kafka-bootstrap", help="with --from-kafka: HOST:PORT[,...] as gradbridge serve took it")
    replay.add_argument("--kafka-topic", help="with --from-kafka: the topic")
    replay.add_argument("--kafka-properties", help="with --from-kafka: the client properties file gradbridge serve took "
                                                   "(security settings; default.api.timeout.ms: the wait for a broker, "
                                                   "default 5000)")
    replay.add_argument("--model-factory", metavar="MODULE:FACTORY",
                        help="your own nn.Module (a function returning it), started from the module's initial tensors "
                             "(default: the model stored in the .pt; a protocol-3 module stores none)")
    replay.set_defaults(run=_replay)


def _add_serve(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve", add_help=False, help="the online-learning HTTP service (gradbridge-serve) from this install; "
                                      "`gradbridge serve --help` for its options")
    serve.add_argument("args", nargs=argparse.REMAINDER, help="gradbridge-serve's options")
    serve.set_defaults(run=_serve)


def _add_recover_log(commands: argparse._SubParsersAction) -> None:
    recover = commands.add_parser(
        "recover-log", help="copy the whole records of a damaged feedback log, up to the damage, into a new log folder",
        description="The online service refuses a log damaged before its end (one line naming the offset). This "
                    "copies the checked records before the damage into a new folder that the service resumes from; "
                    "sequence numbers of new events stay above every number the damaged log may have used.")
    recover.add_argument("--log", required=True, help="the damaged log folder (left as it is)")
    recover.add_argument("--into", required=True, help="a new folder for the recovered log")
    recover.set_defaults(run=_recover_log)


def _add_online_demo(commands: argparse._SubParsersAction) -> None:
    online_demo = commands.add_parser(
        "online-demo", help="a recommender (or a text classifier) learning online in Java from simulated feedback;"
                            " its online metric per version; replay")
    online_demo.add_argument("--model", choices=("recommender", "text"), default="recommender",
                             help="recommender: matrix factorization from clicks; text: a transformer encoder with"
                                  " dropout from labelled sentences (default recommender)")
    online_demo.add_argument("--rounds", type=int, default=300, help="rounds of impressions or sentences (default 300)")
    online_demo.add_argument("--batch", type=int, default=None,
                             help="impressions (default 64) or sentences (default 32) per round")
    online_demo.add_argument("--out-dir", default=None,
                             help="model, log and plot go here (default build/online-demo, build/online-demo-text)")
    online_demo.set_defaults(run=_online_demo)


def _add_online_bench(commands: argparse._SubParsersAction) -> None:
    online_bench = commands.add_parser(
        "online-bench", help="online learner: predict latency with/without training, learning throughput; vs Python")
    online_bench.add_argument("--events", type=int, default=ONLINE_BENCH_EVENTS,
                              help=f"feedback events per throughput round (default {ONLINE_BENCH_EVENTS})")
    online_bench.add_argument("--batch", type=int, default=32, help="micro-batch size (default 32)")
    online_bench.add_argument("--predictions", type=int, default=2000,
                              help="predictions per latency sample, one sample per round (default 2000)")
    online_bench.add_argument("--publish-every", type=int, default=1, help="java: a version every N updates (default 1)")
    online_bench.add_argument("--rounds", type=int, default=5,
                              help="rounds: interleaved throughput rounds (java), latency samples (both) (default 5)")
    online_bench.add_argument("--feeders", type=_bench_threads, default=ONLINE_BENCH_FEEDERS,
                              help="java throughput: concurrent clients feeding the learner, each waiting for its "
                                   f"acknowledgement (default {ONLINE_BENCH_FEEDERS}; 1: one synchronous client)")
    online_bench.add_argument("--out-dir", default="build/online-bench", help="where the JSON goes")
    online_bench.set_defaults(run=_online_bench)


def _add_doctor(commands: argparse._SubParsersAction) -> None:
    doctor = commands.add_parser("doctor", help="check this installation: versions, jars, JVM, torch",
                                 description="Print what gradbridge runs on and one line per problem; exit code 1 "
                                             "when there is any.")
    doctor.set_defaults(run=_doctor)


def _add_verify(commands: argparse._SubParsersAction) -> None:
    verify = commands.add_parser(
        "verify", help="self-check the installed torch: Java and the scripted optimizers and losses bit for bit "
                       "against eager torch (about a minute)",
        description="Runs the fast parity cases the project's tests run on every torch, on this torch, and "
                    "records the verdict for this torch build: a torch newer than the releases gradbridge verified "
                    "trains only after it passed. One line per group; exit code 1 naming the first case that differs.")
    verify.set_defaults(run=_verify)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one ``_add_<command>`` function per command, in `gradbridge --help`'s order."""
    parser = _Parser(prog="gradbridge", description="Train PyTorch models from Java, checked against Python.")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_export(commands)
    _add_state_dict(commands)
    _add_parity(commands)
    _add_build_op(commands)
    _add_gradcheck(commands)
    _add_bench(commands)
    _add_demo(commands)
    _add_replay(commands)
    _add_serve(commands)
    _add_recover_log(commands)
    _add_online_demo(commands)
    _add_online_bench(commands)
    _add_doctor(commands)
    _add_verify(commands)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # every option belongs to the Java service (argparse would claim --help)
        args = argparse.Namespace(command="serve", args=argv[1:], run=_serve)
    else:
        args = build_parser().parse_args(argv)
    if args.command == "export" and args.lr is None and args.model == "linear-regression":
        args.lr = SEED_LR
    try:
        return args.run(args)
    except (GradbridgeError, ValueError, OSError) as ex:
        print(f"{CLI_ERROR_PREFIX}{messages.one_line(ex)}", file=sys.stderr)
        return 1
    except Exception as ex:  # never a traceback for the user; TRACEBACK_ENV shows it for a bug report
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"{CLI_ERROR_PREFIX}unexpected {type(ex).__name__}: {messages.one_line(ex)} "
              f"(set {TRACEBACK_ENV}=1 for the traceback)", file=sys.stderr)
        return 1


#: Set to show the traceback of an unexpected error.
TRACEBACK_ENV = "GRADBRIDGE_TRACEBACK"

