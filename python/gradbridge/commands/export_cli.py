"""`gradbridge export`'s command line: its options (input shapes, loss, optimizer, fine-tuning) and what
they become (``export.command_line.export_from_options``); ``op_library_option``, which other commands take too."""

from __future__ import annotations

import argparse
from typing import Any, Dict, List

from .. import messages, protocol
from ..models import BUILTIN_MODELS, SEED_LR

# Optimizer and loss flags: only those given are passed, so each class keeps its own defaults.
_OPTIMIZER_FLAGS = ("lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize", "betas", "eps",
                    "amsgrad", "alpha", "centered", "lr_decay", "initial_accumulator_value")
_LOSS_FLAGS = ("reduction", "beta", "delta", "label_smoothing", "ignore_index", "class_weights", "pos_weight")


def _floats(text: str) -> List[float]:
    return [float(v) for v in text.split(",") if v.strip()]


_floats.__name__ = "list (comma-separated numbers)"


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
        clip_value=args.clip_value, init_weights=args.init_weights, check=args.check, format=args.format,
        autocast=args.autocast)
    capture = protocol.read_metadata(path).get(protocol.CAPTURE_KEY, {})
    print(f"wrote {path} ({messages.format_chosen(capture.get('kind', ''), protocol.AUTO_REASON_KEY in capture)})")
    return 0


def op_library_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op-library", action="append", default=[], metavar="FILE",
                        help="custom-operator library to load first (repeatable); never taken from the .pt")


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


def add_export(commands: argparse._SubParsersAction) -> None:
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
    export.add_argument("--autocast", choices=("bfloat16", "float16"),
                        help="run the model's forward and the loss under torch.autocast(\"cpu\", dtype=...), as "
                             "eager code in that region: mixed precision without editing the model (the Python "
                             "API's autocast=; recorded as the metadata's capture.autocast)")
    export.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the check of the export against the eager model (two training steps and eval on "
                             "an example batch, bit for bit); only for a model too large to run twice")
    op_library_option(export)
    export.set_defaults(run=_export)
