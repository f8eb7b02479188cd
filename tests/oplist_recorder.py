"""A pytest plugin that records every operator (and overload) the protocol-3 capture emits, to derive and
refresh protocol 3's operator allow-list (python/gradbridge/_runtime/oplist_rules.json):

    GRADBRIDGE_RECORD_OPS=/tmp/ops.txt .venv/bin/python -m pytest -p tests.oplist_recorder tests/test_protocol3.py

While it records, the Python reader lets every operator through (each op list the export reads back before
writing it adds its ``op.overload`` lines to the file); tests that load the files in Java still refuse one
off the list. ``python -m tests.oplist_recorder OUT [CASE...]`` exports the model zoo (tests/models/zoo.py), or
the cases named, alike.
"""

from __future__ import annotations

import os
import sys

from gradbridge._runtime import oplist_check


class _Recording(frozenset):
    """The allow-list while recording: holds every operator, and writes down each one asked about."""

    def __contains__(self, name: object) -> bool:
        path = os.environ.get("GRADBRIDGE_RECORD_OPS")
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(f"{name}\n")
        return True


if os.environ.get("GRADBRIDGE_RECORD_OPS"):
    oplist_check.OPERATORS = _Recording()


def _zoo(out: str, only=()) -> None:
    import tempfile
    from pathlib import Path

    import torch

    from gradbridge import export_training_module
    from gradbridge._runtime import inputs
    from tests.models import zoo

    os.environ["GRADBRIDGE_RECORD_OPS"] = out
    oplist_check.OPERATORS = _Recording()
    with tempfile.TemporaryDirectory() as folder:
        for case in [c for c in zoo.CASES if not only or c.name in only]:
            torch.manual_seed(0)
            x, y = case.data(8, 0)
            example = (inputs.select(x, torch.arange(4)), y[:4])
            try:
                export_training_module(case.build(), "cross_entropy", {"name": "adamw", "lr": 1e-3},
                                       Path(folder) / "m.pt", example_inputs=example, format="export")
                print(case.name, "exported")
            except Exception as ex:  # refused at export: its ops are not needed
                print(case.name, "refused:", str(ex)[:100])


if __name__ == "__main__":
    _zoo(sys.argv[1], sys.argv[2:])
