"""The `gradbridge` command line (also `python -m gradbridge`)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from .errors import GradbridgeError
from .models import BUILTIN_MODELS


def _export(args: argparse.Namespace) -> int:
    from .export import export_builtin

    path = export_builtin(args.model, args.output, seed=args.seed, lr=args.lr)
    print(f"wrote {path}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(epochs=args.epochs, out_dir=args.out_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gradbridge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    export = commands.add_parser("export", help="export a training module (.pt)")
    export.add_argument("model", choices=sorted(BUILTIN_MODELS), help="built-in model")
    export.add_argument("-o", "--output", required=True, help="output .pt")
    export.add_argument("--seed", type=int, default=0, help="torch seed for the initial parameters (default 0)")
    export.add_argument("--lr", type=float, default=0.01, help="learning rate recorded in the metadata (default 0.01)")
    export.set_defaults(run=_export)

    demo = commands.add_parser("demo", help="export, train from Java (gradle run and in-process), check parity")
    demo.add_argument("--epochs", type=int, default=1000, help="epochs (default 1000)")
    demo.add_argument("--out-dir", default="build/demo", help="where models and histories go")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (GradbridgeError, ValueError, OSError) as ex:
        print(f"gradbridge: error: {ex}", file=sys.stderr)
        return 1
