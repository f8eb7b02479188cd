"""Reads and runs protocol-3 files in a process of its own, so that an abort (SIGSEGV, SIGFPE) is caught by the
test that started it (tests/test_faults_protocol3.py): for each file, Python's reader and interpreter
(``read_program``, ``Program``) and Java's (the in-process JVM: load, two train steps, an epoch's schedule
step, evaluate), one JSON line each: ``{"file": ..., "python": LINE, "java": LINE}``, LINE ``"ok"`` or the
error's one line (``"UNEXPECTED ..."`` for an exception that is not gradbridge's).

    python -m tests.protocol3_worker DATA.npz FILE.pt...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def _python(path: Path, x, y) -> str:
    import torch

    from gradbridge import GradbridgeError, protocol
    from gradbridge._runtime.program import Program, read_program

    try:
        metadata, graphs, state = read_program(path)
        entry = metadata[protocol.PROGRAM_KEY]
        twin = Program(graphs, state, [p["name"] for p in metadata["parameters"]], entry["training"],
                       entry["counters"], where=str(path))
        xs, ys = {"x": torch.from_numpy(x)}, torch.from_numpy(y)
        for _ in range(2):
            twin.train_step(xs, ys)
        twin.evaluate(xs, ys)
        return "ok"
    except GradbridgeError as ex:
        return str(ex)
    except Exception as ex:  # noqa: BLE001  (what the test reports as a failure)
        return f"UNEXPECTED {type(ex).__name__}: {ex}"


def _java(path: Path, x, y) -> str:
    from gradbridge import GradbridgeError
    from gradbridge.jvm import java_errors, load_module, to_tensor

    try:
        module = load_module(path)
        try:
            with java_errors():
                tx, ty = to_tensor(x), to_tensor(y)
                for _ in range(2):
                    module.trainStep(tx, ty)
                module.scheduleEpoch(float(module.evaluate(tx, ty)))
            return "ok"
        finally:
            module.close()
    except GradbridgeError as ex:
        return str(ex)
    except Exception as ex:  # noqa: BLE001
        return f"UNEXPECTED {type(ex).__name__}: {ex}"


def main(argv) -> None:
    data = np.load(argv[0])
    x, y = data["x"], data["y"]
    for name in argv[1:]:
        path = Path(name)
        line = {"file": name, "python": _python(path, x, y)}
        line["java"] = _java(path, x, y)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
