"""The `gradbridge` command line (also `python -m gradbridge`): parses arguments and hands each
command to its module in this package; errors become one ``error:`` line and exit 1."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from .. import messages, protocol
from ..errors import CLI_ERROR_PREFIX, GradbridgeError
from .._runtime.files import check_writable
from ..models import SEED_LR
from ..parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL
from . import state_dict
from .export_cli import add_export, op_library_option

def _tolerance(text: str) -> float:
    """A tolerance: a finite number >= 0 (argparse turns ValueError into one usage line)."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return value


_tolerance.__name__ = "tolerance (a finite number >= 0)"


def _parity(args: argparse.Namespace) -> int:
    from .parity import run, run_spark_history

    # each run's own settings, as given (None: not given; run() has the defaults)
    settings = {"val_path": args.val, "epochs": args.epochs, "batch_size": args.batch_size, "seed": args.seed,
                "mode": args.mode, "java_mode": args.java, "device": args.device}
    common = dict(rtol=args.rtol, atol=args.atol, report_path=args.report, plot_path=args.plot,
                  op_libraries=args.op_library, model_factory=args.model_factory)
    if args.spark_history is not None:
        given = [name for name, value in settings.items() if value is not None]
        if given:
            flag = {"val_path": "--val", "java_mode": "--java"}.get(given[0], "--" + given[0].replace("_", "-"))
            raise ValueError(messages.spark_history_option(flag))
        return run_spark_history(args.model, args.data, args.spark_history, **common)
    return run(args.model, args.data, **{name: value for name, value in settings.items() if value is not None},
               **common)


def _build_op(args: argparse.Namespace) -> int:
    from .._runtime import ops

    check_writable(args.output)
    print(f"wrote {ops.build(args.sources, args.output)}")
    return 0


def _gradcheck(args: argparse.Namespace) -> int:
    from .gradcheck import run

    return run(args.model, args.data, batch_size=args.batch_size, op_libraries=args.op_library,
               max_elements=args.max_elements, report_path=args.report, model_factory=args.model_factory)


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


def _add_parity(commands: argparse._SubParsersAction) -> None:
    parity = commands.add_parser(
        "parity", help="train with the Python reference and with Java, compare every epoch",
        description="Train MODEL.pt on the same data with eager PyTorch (torch.optim) and with the Java Trainer, "
                    "print a per-epoch table and say whether they agree. Exit code 0 only within tolerance. With "
                    "--spark-history, replay a gradbridge-spark run instead and compare it with its history.")
    parity.add_argument("model", help="exported training module (.pt)")
    parity.add_argument("--data", required=True, help=".npz with arrays x and y")
    parity.add_argument("--val", help=".npz with validation arrays x and y")
    parity.add_argument("--epochs", type=int)  # these: None unless given (the defaults are run()'s)
    parity.add_argument("--batch-size", type=int)
    parity.add_argument("--seed", type=int)
    parity.add_argument("--mode", choices=protocol.MODES)
    parity.add_argument("--java", choices=("inprocess", "subprocess", "both"),
                        help="in this process through JPype (exact), a separate JVM, or both")
    parity.add_argument("--spark-history", metavar="HISTORY",
                        help="instead of training Java, replay the gradbridge-spark run that wrote this history "
                             "(its partitions, batch size, seed and the tasks' threads, as it records them) from "
                             "MODEL on --data, and compare its epochs")
    parity.add_argument("--rtol", type=_tolerance,
                        help=f"relative tolerance (default: 0 in-process, {SEPARATE_JVM_RTOL:g} subprocess)")
    parity.add_argument("--atol", type=_tolerance,
                        help=f"absolute tolerance (default: 0 in-process, {SEPARATE_JVM_ATOL:g} subprocess)")
    parity.add_argument("--model-factory", metavar="MODULE:FACTORY",
                        help="your own nn.Module (a function returning it) for the eager side, started from the "
                             "module's initial tensors (default: the model stored in the .pt)")
    parity.add_argument("--device",
                        help="train both sides on cpu, cuda or cuda:N (default: cpu); on CUDA with torch's "
                             "deterministic algorithms and CUBLAS_WORKSPACE_CONFIG=:4096:8")
    parity.add_argument("--report", help="write every figure as JSON here")
    parity.add_argument("--plot", help="write loss curves and |difference| per epoch as PNG here")
    op_library_option(parity)
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
    op_library_option(gradcheck)
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
    """The whole command line: one ``_add_<command>`` function per command (export's and state-dict's in their
    own modules), in `gradbridge --help`'s order."""
    parser = _Parser(prog="gradbridge", description="Train PyTorch models from Java, checked against Python.")
    commands = parser.add_subparsers(dest="command", required=True)
    add_export(commands)
    state_dict.add_parser(commands)
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

