"""`gradbridge state-dict`: the trained weights of an export or a Java checkpoint, back where they came from:
the model's whole state_dict (torch.save or safetensors) and a PEFT model's adapter in PEFT's own layout
(``export.weights``)."""

from __future__ import annotations

import argparse


def add_parser(commands: argparse._SubParsersAction) -> None:
    from ..export.weights import ADAPTER_CONFIG, ADAPTER_WEIGHTS, FORMATS

    suffixes = "; ".join(f"{name}: {', '.join(found)}" for name, found in FORMATS.items())
    state = commands.add_parser(
        "state-dict", help="turn an exported module or a Java checkpoint into a state_dict file or a PEFT adapter",
        description="Write the model's state_dict held by MODULE (an export or a Java checkpoint: its current, "
                    "trained values), under the keys of the model's own state_dict(), each tensor in the dtype it "
                    "trained in: as safetensors (model.load_state_dict(safetensors.torch.load_file(FILE))) or with "
                    "torch.save (model.load_state_dict(torch.load(FILE, weights_only=True))); and, for a PEFT model, "
                    "its adapter alone as PeftModel.save_pretrained writes it (PeftModel.from_pretrained(base, DIR)).")
    state.add_argument("module", help="exported module or checkpoint (.pt)")
    state.add_argument("-o", "--output", metavar="FILE",
                       help=f"state_dict file to write; its suffix picks the format ({suffixes})")
    state.add_argument("--format", choices=tuple(FORMATS), help="the format of -o FILE, whatever its suffix")
    state.add_argument("--adapter", metavar="DIR",
                       help=f"a PEFT model's adapter: {ADAPTER_WEIGHTS} and {ADAPTER_CONFIG} in DIR (another "
                            "adapter than 'default' in DIR/NAME, as PEFT saves it)")
    state.add_argument("--base", metavar="MODEL",
                       help="an online checkpoint's module file: the frozen tensors a .trained.pt leaves out")
    state.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..export.weights import write

    for path in write(args.module, args.output, format=args.format, adapter=args.adapter, base=args.base):
        print(f"wrote {path}")
    return 0
