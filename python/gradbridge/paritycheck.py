"""`gradbridge parity`: train a module with the eager reference and with Java on the same data,
compare every epoch, and say plainly whether the runs agree."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

from . import data, java, protocol, reference, report
from .parity import compare_histories

JAVA_MODES = ("inprocess", "subprocess", "both")
#: A separate JVM runs DJL's own libtorch build, not pip's: float32-level differences may appear.
SUBPROCESS_RTOL = 1e-5
SUBPROCESS_ATOL = 1e-6


def run(model: str | os.PathLike, data_path: str | os.PathLike, *, val_path: str | os.PathLike | None = None,
        epochs: int = 5, batch_size: int = 32, seed: int = 0, mode: str = "step", java_mode: str = "inprocess",
        rtol: Optional[float] = None, atol: Optional[float] = None, report_path: str | os.PathLike | None = None,
        plot_path: str | os.PathLike | None = None, out: Callable[[str], None] = print) -> int:
    """Returns the exit code: 0 only when every comparison is within tolerance.

    Tolerances: in-process Java shares this process's libtorch and is compared exactly unless
    ``rtol``/``atol`` are given; a subprocess defaults to SUBPROCESS_RTOL/ATOL.
    """
    if java_mode not in JAVA_MODES:
        raise ValueError(f"--java must be one of {', '.join(JAVA_MODES)}, got {java_mode!r}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    metadata = protocol.read_metadata(model)
    x, y = data.load_npz(data_path)
    data.check(metadata, x, y, str(data_path))
    val = None
    if val_path is not None:
        val = data.load_npz(val_path)
        data.check(metadata, *val, str(val_path))
    settings = dict(epochs=epochs, batch_size=batch_size, seed=seed, mode=mode)

    python = reference.train(model, x, y, val=val, **settings)
    others, reports = {}, []
    if java_mode in ("inprocess", "both"):
        others["java"] = java.train(model, x, y, val=val, **settings)
        reports.append(compare_histories(python, others["java"], rtol=rtol or 0.0, atol=atol or 0.0,
                                         labels=("python", "java")))
    if java_mode in ("subprocess", "both"):
        with tempfile.TemporaryDirectory() as folder:
            others["java-subprocess"] = java.train_subprocess(model, data_path, val=val_path,
                                                              history=Path(folder) / "history.jsonl", **settings)
        reports.append(compare_histories(
            python, others["java-subprocess"], labels=("python", "java-subprocess"),
            rtol=SUBPROCESS_RTOL if rtol is None else rtol, atol=SUBPROCESS_ATOL if atol is None else atol))

    out(f"{Path(model).name} ({metadata['model']}, {metadata['optimizer']['name']}, {metadata['loss']['name']}): "
        f"{len(x)} samples, {epochs} epochs, mode {mode}, batch {batch_size}, seed {seed}")
    for parity in reports:
        out("")
        out(parity.table())
    config = {"model": str(model), "data": str(data_path), "val": None if val_path is None else str(val_path),
              "java": java_mode, **settings}
    if report_path is not None:
        out(f"report: {report.write_json(report_path, config, reports)}")
    if plot_path is not None:
        title = f"{Path(model).name}: python vs {' and '.join(others)} ({mode}, {epochs} epochs)"
        out(f"plot: {report.write_plot(plot_path, title, python, others, reports)}")
    return 0 if all(parity.within_tolerance for parity in reports) else 1

