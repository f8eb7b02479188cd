"""`gradbridge parity`: train a module with the eager reference and with Java on the same data,
compare every epoch, and say plainly whether the runs agree; with ``--spark-history``, replay the
gradbridge-spark run that wrote that history and compare it epoch by epoch."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

from .._runtime import data, devices, launcher, ops, torch_gate
from .. import java, protocol, reference, spark_history
from . import parity_report
from ..errors import CLI_ERROR_PREFIX, GradbridgeError
from ..history import History
from ..export.command_line import build_model
from .._runtime.files import check_writable
from ..parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL, compare_histories

JAVA_MODES = ("inprocess", "subprocess", "both")


def reference_label(metadata: dict, model_factory: Optional[str]) -> str:
    """Which eager model the comparison ran against, in words (printed, and in the report)."""
    if model_factory is not None:
        return f"your eager nn.Module ({model_factory}) and torch.optim"
    capture = metadata.get(protocol.CAPTURE_KEY, {})
    checked = ("the export was checked against your nn.Module bit for bit" if capture.get("checked")
               else "the export was NOT checked against your nn.Module")
    return (f"the model stored in the .pt (TorchScript, {capture.get('kind', 'script')}) and torch.optim, not your "
            f"nn.Module ({checked}); pass --model-factory MODULE:FACTORY to compare with it")


def run(model: str | os.PathLike, data_path: str | os.PathLike, *, val_path: str | os.PathLike | None = None,
        epochs: int = 5, batch_size: int = protocol.DEFAULT_BATCH_SIZE, seed: int = protocol.DEFAULT_SEED,
        mode: str = protocol.DEFAULT_MODE, java_mode: str = "inprocess",
        rtol: Optional[float] = None, atol: Optional[float] = None, report_path: str | os.PathLike | None = None,
        plot_path: str | os.PathLike | None = None, op_libraries: Sequence[str | os.PathLike] = (),
        model_factory: Optional[str] = None, device: str = devices.CPU, out: Callable[[str], None] = print) -> int:
    """Returns the exit code: 0 only when every comparison is within tolerance.

    Tolerances: in-process Java shares this process's libtorch and is compared exactly unless
    ``rtol``/``atol`` are given; a subprocess defaults to parity.SEPARATE_JVM_RTOL/ATOL.
    A Java variant that fails does not discard the other: its table and report are kept, the
    failure is one error line on stderr, exit code 1. When every variant fails, the first
    failure is raised. ``op_libraries`` are loaded into this process and into every JVM first.
    ``model_factory`` (``MODULE:FACTORY``): the user's own nn.Module for the eager side, started from
    the module's initial tensors; without it, the eager side runs the model stored in the .pt, and
    the output says so. ``device``: where both sides train (``cpu``, ``cuda``, ``cuda:N``; on CUDA with
    torch's deterministic algorithms, which the report records); checked before anything trains.
    """
    if java_mode not in JAVA_MODES:
        raise ValueError(f"--java must be one of {', '.join(JAVA_MODES)}, got {java_mode!r}")
    _check_tolerances_and_outputs(rtol, atol, report_path, plot_path)
    device = devices.require(device)  # before anything trains: one line naming the device and why
    torch_gate.require_torch()  # before the eager run: a refused torch trains nothing
    metadata = protocol.read_metadata(model)
    ops.prepare(metadata, op_libraries, str(model))
    x, y = data.load_checked(metadata, data_path)
    val = None if val_path is None else data.load_checked(metadata, val_path)
    settings = dict(epochs=epochs, batch_size=batch_size, seed=seed, mode=mode)
    sources = dict(source=str(data_path), val_source=str(val_path))  # the files, in a refusal's line
    user_model = None if model_factory is None else build_model(model_factory)

    on = {"device": device} if devices.is_cuda(device) else {}  # the CPU: the calls of every release before
    python = reference.train(model, x, y, val=val, model=user_model, **settings, **sources, **on)
    settings["op_libraries"] = op_libraries
    others, reports, failures = _java_runs(model, data_path, val_path, x, y, val, python, java_mode=java_mode,
                                           settings=settings, sources=sources, on=on, rtol=rtol, atol=atol)
    if failures and not reports:
        raise next(iter(failures.values()))

    out(f"{Path(model).name} ({metadata['model']}, {metadata['optimizer']['name']}, {metadata['loss']['name']}): "
        f"{len(y)} samples, {epochs} epochs, mode {mode}, batch {batch_size}, seed {seed}"
        + (f", on {device} (deterministic algorithms)" if on else ""))
    eager_side = reference_label(metadata, model_factory)
    out(f"reference: {eager_side}")
    for parity in reports:
        out("")
        out(parity.table())
    config = {"model": str(model), "data": str(data_path), "val": None if val_path is None else str(val_path),
              "java": java_mode, **settings, "op_libraries": [str(p) for p in op_libraries],
              "reference": eager_side, **({"device": device, "deterministic": True} if on else {})}
    title = f"{Path(model).name}: python vs {' and '.join(others)} ({mode}, {epochs} epochs)"
    _write_outputs(report_path, plot_path, config, title, python, others, reports, failures, out)
    return 0 if not failures and all(parity.within_tolerance for parity in reports) else 1


def _check_tolerances_and_outputs(rtol: Optional[float], atol: Optional[float],
                                  report_path: str | os.PathLike | None, plot_path: str | os.PathLike | None) -> None:
    """The tolerances given, and that the report and plot can be written: before the training, not after it."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    for output in (report_path, plot_path):
        if output is not None:
            check_writable(output)


def _java_runs(model, data_path, val_path, x, y, val, python: History, *, java_mode: str, settings: dict,
               sources: dict, on: dict, rtol: Optional[float], atol: Optional[float]) -> Tuple[dict, list, dict]:
    """The Java variants ``java_mode`` asks for, each compared with the eager ``python`` history: their
    histories and reports by label, and the failure of each variant that failed (the others kept)."""
    others, reports, failures = {}, [], {}
    if java_mode in ("inprocess", "both"):
        try:
            others["java"] = java.train(model, x, y, val=val, **settings, **sources, **on)
            reports.append(compare_histories(python, others["java"], rtol=rtol or 0.0, atol=atol or 0.0,
                                             labels=("python", "java")))
        except GradbridgeError as ex:
            failures["java"] = ex
    if java_mode in ("subprocess", "both"):
        try:
            with tempfile.TemporaryDirectory() as folder:
                others["java-subprocess"] = launcher.train(model, data_path, val=val_path,
                                                                  history=Path(folder) / "history.jsonl", **settings, **on)
            reports.append(compare_histories(
                python, others["java-subprocess"], labels=("python", "java-subprocess"),
                rtol=SEPARATE_JVM_RTOL if rtol is None else rtol, atol=SEPARATE_JVM_ATOL if atol is None else atol))
        except GradbridgeError as ex:
            failures["java-subprocess"] = ex
    return others, reports, failures


def _write_outputs(report_path, plot_path, config: dict, title: str, python: History, others: dict, reports: list,
                   failures: dict, out: Callable[[str], None]) -> None:
    """The JSON report and the plot where asked for (a plot only when a Java variant ran), then one error
    line on stderr per failed variant."""
    if report_path is not None:
        failed = {label: str(ex) for label, ex in failures.items()}
        out(f"report: {parity_report.write_json(report_path, config, reports, failed)}")
    if plot_path is not None and others:
        out(f"plot: {parity_report.write_plot(plot_path, title, python, others, reports)}")
    for label, ex in failures.items():
        print(f"{CLI_ERROR_PREFIX}{label}: {ex}", file=sys.stderr)


def run_spark_history(model: str | os.PathLike, data_path: str | os.PathLike, history_path: str | os.PathLike, *,
                      rtol: Optional[float] = None, atol: Optional[float] = None,
                      report_path: str | os.PathLike | None = None, plot_path: str | os.PathLike | None = None,
                      op_libraries: Sequence[str | os.PathLike] = (), model_factory: Optional[str] = None,
                      out: Callable[[str], None] = print) -> int:
    """Replay the gradbridge-spark run that wrote ``history_path`` (``reference.train_sharded(..., run=)``: its
    partitions, batch size, seed, shuffling and the tasks' thread count, as the history records them) on
    ``data_path`` from ``model`` (the module the run started from), and compare the history's epochs with
    the replay's; exit code 0 only within tolerance (bit for bit unless ``rtol``/``atol`` are given). A
    history without what the replay needs, or of other data, is refused in one line before anything trains."""
    _check_tolerances_and_outputs(rtol, atol, report_path, plot_path)
    run = spark_history.read(history_path)  # its one-line refusals before the module and the data are read
    torch_gate.require_torch()
    metadata = protocol.read_metadata(model)
    ops.prepare(metadata, op_libraries, str(model))
    x, y = data.load_checked(metadata, data_path)
    user_model = None if model_factory is None else build_model(model_factory)
    settings, epochs = run.settings, run.epochs
    out(f"{Path(model).name} ({metadata['model']}, {metadata['optimizer']['name']}, {metadata['loss']['name']}): "
        f"{len(y)} samples; {Path(history_path).name}: {_epochs(epochs)} of a gradbridge-spark run "
        f"on {settings.partitions} partitions, batch {settings.batch_size}, seed {settings.seed}, "
        f"{'shuffled' if settings.shuffle else 'in order'}, rule {settings.rule}"
        + (" (replayed from epoch 0)" if epochs[0] else ""))
    replay = reference.train_sharded(model, x, y, run=run, model=user_model, source=str(data_path), say=out)
    by_epoch = {record.epoch: record for record in replay}
    python = History([by_epoch[epoch] for epoch in epochs])
    report = compare_histories(python, run.history, rtol=rtol or 0.0, atol=atol or 0.0, labels=("python", "spark"))
    eager_side = reference_label(metadata, model_factory)
    out(f"reference: {eager_side}")
    out("")
    out(report.table())
    if report_path is not None:
        config = {"model": str(model), "data": str(data_path), "spark_history": str(history_path),
                  **settings.to_json(), "threads": run.threads, "epochs": list(epochs),
                  "op_libraries": [str(p) for p in op_libraries], "reference": eager_side}
        out(f"report: {parity_report.write_json(report_path, config, [report])}")
    if plot_path is not None:
        title = f"{Path(model).name}: python vs spark ({Path(history_path).name}, {len(epochs)} epochs)"
        out(f"plot: {parity_report.write_plot(plot_path, title, python, {'spark': run.history}, [report])}")
    return 0 if report.within_tolerance else 1


def _epochs(epochs: Sequence[int]) -> str:
    return f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}..{epochs[-1]}"
