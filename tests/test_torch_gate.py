"""A torch newer than the verified releases: the release-day drill, and TorchScript's removal.

The drill lowers "verified up to" below this venv's torch (in the test process, and through a
preamble in the processes it starts: no fake torch version anywhere), so this torch plays the new
release: the first training call runs `gradbridge verify` once (the one real self-check of the
default suite, about a minute), a second process reuses its verdict, doctor reports it, another build
is not covered by it, and a case made to fail refuses training with its line. Each test keeps its
verdicts in a cache folder of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from packaging.version import Version

from gradbridge import TorchScriptUnavailableError, export_training_module, messages, protocol
from gradbridge._runtime import libtorch, native
from gradbridge import reference, verify
from gradbridge._runtime import torch_gate
from gradbridge.commands import verify as verify_command
from gradbridge.errors import CLI_ERROR_PREFIX, SetupError
from tests.models.custom import export_regressor

_TORCH = Version(libtorch.torch_version())
#: A "verified up to" below this torch: this torch is the release newer than every verified one.
LOWERED = f"{_TORCH.major}.{_TORCH.minor - 1}"
_PREAMBLE = f"import gradbridge._runtime.libtorch as lt; lt.verified_up_to = lambda: {LOWERED!r}; "


def _cache(folder: Path) -> Path:
    """A cache folder of its own for verdicts, sharing the native libraries already built."""
    cache = folder / "cache"
    cache.mkdir()
    (native.cache_dir() / "native").mkdir(parents=True, exist_ok=True)
    (cache / "native").symlink_to(native.cache_dir() / "native")
    return cache


def _gradbridge(args, cwd, cache, **env):
    """`gradbridge ARGS` in a fresh process with the lowered mark and ``cache`` as the cache folder."""
    code = _PREAMBLE + "import sys; from gradbridge.commands.main import main; sys.exit(main(sys.argv[1:]))"
    environment = {k: v for k, v in os.environ.items() if k != torch_gate.AUTO_ENV}
    environment.update({native.CACHE_ENV: str(cache), **env})
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env=environment, timeout=600)


@pytest.fixture(scope="module")
def regressor(tmp_path_factory):
    folder = tmp_path_factory.mktemp("regressor")
    path, _, _ = export_regressor(folder)
    return path, folder / "train.npz"


def _parity(regressor, cwd, cache, **env):
    path, data = regressor
    return _gradbridge(["parity", path, "--data", data, "--epochs", 2, "--java", "inprocess"], cwd, cache, **env)


@pytest.fixture(scope="module")
def drill(regressor, tmp_path_factory):
    """Two training processes on the "new" torch, one after the other: (cache, first, second)."""
    folder = tmp_path_factory.mktemp("drill")
    cache = _cache(folder)
    return cache, _parity(regressor, folder, cache), _parity(regressor, folder, cache)


@pytest.fixture
def lowered(monkeypatch, tmp_path):
    """This process with the lowered mark and a cache folder of its own; returns the cache."""
    cache = _cache(tmp_path)
    monkeypatch.setattr(libtorch, "verified_up_to", lambda: LOWERED)
    monkeypatch.setenv(native.CACHE_ENV, str(cache))
    monkeypatch.delenv(torch_gate.AUTO_ENV, raising=False)
    return cache


def test_the_mark_is_one_minor_release_and_this_torch_is_above_the_lowered_one():
    assert Version(libtorch.verified_up_to()).release == Version(libtorch.verified_up_to()).release[:2]
    assert libtorch.in_range(libtorch.torch_version()) and Version(LOWERED) < _TORCH


def test_the_first_training_call_runs_the_self_check_once_and_passes(drill):
    cache, first, _ = drill
    assert first.returncode == 0, first.stdout + first.stderr
    starts = f"gradbridge: {messages.torch_self_check_starts(libtorch.torch_version(), LOWERED)}"
    lines = first.stderr.splitlines()
    assert lines.count(starts) == 1, first.stderr
    # one progress line per group, then the verdict
    for name, _ in verify.GROUPS:
        assert [line for line in lines if line.strip().startswith(f"{name} ") and " ok: " in line], (name, lines)
    assert "java: bitwise identical over 2 epochs" in first.stdout
    (verdict_file,) = (cache / torch_gate.FOLDER).glob("*.json")
    verdict = json.loads(verdict_file.read_text())
    assert verdict["passed"] and verdict["torch"] == torch.__version__, verdict
    assert verdict_file.name == f"{torch_gate.torch_build().name}.json"


def test_a_second_process_reuses_the_verdict(drill):
    _, _, second = drill
    assert second.returncode == 0, second.stdout + second.stderr
    assert "gradbridge verify" not in second.stderr and "checking it once" not in second.stderr, second.stderr
    assert "java: bitwise identical over 2 epochs" in second.stdout


def test_doctor_reports_the_self_checked_torch(drill, tmp_path):
    cache, _, _ = drill
    result = _gradbridge(["doctor"], tmp_path, cache)
    rows = {line[:22].strip(): line[22:].strip() for line in result.stdout.splitlines()}
    assert rows["torch self-check"].startswith("self-checked on this machine (`gradbridge verify` passed here "), rows


def test_another_torch_build_is_checked_again(drill, monkeypatch):
    cache, _, _ = drill
    monkeypatch.setattr(libtorch, "verified_up_to", lambda: LOWERED)
    monkeypatch.setenv(native.CACHE_ENV, str(cache))
    monkeypatch.setenv(torch_gate.AUTO_ENV, "0")
    assert torch_gate.require_torch() == libtorch.torch_version()  # this build: the verdict holds
    other = torch_gate.TorchBuild(torch.__version__, "0" * 16)
    monkeypatch.setattr(torch_gate, "torch_build", lambda: other)
    with pytest.raises(SetupError) as refused:
        torch_gate.require_torch()
    assert str(refused.value) == messages.torch_unchecked(libtorch.torch_version(), LOWERED, torch_gate.AUTO_ENV)
    # with automatic checks on, that build is checked again (the self-check itself is the drill's first run)
    monkeypatch.delenv(torch_gate.AUTO_ENV)
    checked = []
    monkeypatch.setattr(torch_gate, "_self_check", lambda version: checked.append(version) or {"passed": True})
    assert torch_gate.require_torch() == libtorch.torch_version() and checked == [libtorch.torch_version()]


def test_without_automatic_checks_an_unchecked_torch_is_one_line(regressor, tmp_path):
    cache = _cache(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    result = _parity(regressor, work, cache, **{torch_gate.AUTO_ENV: "0"})
    assert result.returncode == 1 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        CLI_ERROR_PREFIX + messages.torch_unchecked(libtorch.torch_version(), LOWERED, torch_gate.AUTO_ENV)]
    assert not list(work.iterdir()) and not list(cache.glob(f"{torch_gate.FOLDER}/*.json"))


def test_a_failing_case_refuses_training_with_its_line(lowered, regressor, tmp_path, monkeypatch):
    # Given a self-check whose mse case expects a value one part in a million off
    cases = verify.loss_cases()
    spec, prediction, target, _ = cases[0]
    assert spec == {"name": "mse"}
    monkeypatch.setattr(verify, "loss_cases", lambda: [(spec, prediction, target,
                                                        lambda p, t: F.mse_loss(p, t) * (1 + 1e-6))] + cases[1:])
    # When it runs, it stops at that case with one line naming it and its first difference
    printed = []
    assert verify_command.run(printed.append) == 1
    failed = [line for line in printed if "FAILED" in line]
    line = json.loads(torch_gate.verdict_path().read_text())["line"]
    assert line.startswith("losses / name=mse: loss ") and "vs torch.nn.functional's" in line, line
    assert failed == [f"  {'losses':<16} FAILED: {line}", failed[-1]] and failed[-1].startswith("FAILED in "), printed
    assert not [p for p in printed if "in-process Java" in p]  # it stops at the first failing group
    # Then a training call in another process refuses this torch with that line, and writes nothing
    work = tmp_path / "work"
    work.mkdir()
    result = _parity(regressor, work, lowered)
    assert result.returncode == 1 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        CLI_ERROR_PREFIX + messages.torch_self_check_failed(libtorch.torch_version(), line)]
    assert not list(work.iterdir())
    doctor = _gradbridge(["doctor"], work, lowered)
    assert (f"problem: torch self-check: {messages.torch_self_check_failed(libtorch.torch_version(), line)}"
            in doctor.stdout.splitlines()), doctor.stdout


# ---- what the machine does to the gate: a full disk, the cache folder, doctor's probe ----

def _everywhere(folder: Path, *lines: str) -> dict:
    """PYTHONPATH for _gradbridge with a sitecustomize that lowers the mark in every process it starts too
    (doctor's JVM probe, the self-check's own process), then runs ``lines``."""
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_PREAMBLE + "\n" + "\n".join(lines) + "\n")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}


def _mount(mount_point: Path, options: str) -> None:
    """A tmpfs at ``mount_point`` (needs root, as on the CI machines; the test is skipped elsewhere)."""
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")


@pytest.fixture
def full_disk(tmp_path):
    """A tmpfs with no room for one more file or folder."""
    mount_point = tmp_path / "full"
    _mount(mount_point, "size=64k,nr_inodes=1")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_a_full_disk_during_the_native_build_is_not_a_failed_self_check(regressor, tmp_path, monkeypatch,
                                                                          full_disk):
    """Before, the build's disk error was recorded as this torch's failed self-check, and every later run
    refused the torch with it, after the disk was freed too."""
    # Given the native library to build for the unchecked torch (no prebuilt one) on a disk that is full
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "native").symlink_to(full_disk)
    work = tmp_path / "work"
    work.mkdir()
    env = _everywhere(tmp_path, "import gradbridge._runtime.native as n; n._prebuilt_folders = lambda build: []")
    # When a training command runs the self-check
    result = _parity(regressor, work, cache, **env)
    # Then it stops in one line naming the cache folder and the disk error, and records nothing
    monkeypatch.setenv(native.CACHE_ENV, str(cache))
    folder = native.cache_folder(native.current_build())
    unwritable = messages.cache_unwritable(str(folder), "No space left on device")
    assert [line for line in result.stderr.splitlines() if line.startswith(CLI_ERROR_PREFIX)] == [
        CLI_ERROR_PREFIX + messages.torch_self_check_incomplete(
            libtorch.torch_version(), messages.torch_self_check_unfinished(verify.BUILD_GROUP, unwritable))], \
        result.stderr
    assert result.returncode == 1 and result.stdout == "", result.stdout + result.stderr
    assert not list(cache.glob(f"{torch_gate.FOLDER}/*.json")) and not list(work.iterdir())
    # And once the disk has room, the next run checks this torch again
    subprocess.run(["mount", "-o", "remount,nr_inodes=1000", str(full_disk)], check=True)
    monkeypatch.setattr(libtorch, "verified_up_to", lambda: LOWERED)
    monkeypatch.delenv(torch_gate.AUTO_ENV, raising=False)
    assert torch_gate.read_verdict() is None
    checked = []
    monkeypatch.setattr(torch_gate, "_self_check", lambda version: checked.append(version) or {"passed": True})
    assert torch_gate.require_torch() == libtorch.torch_version() and checked == [libtorch.torch_version()]


def test_a_machine_failure_in_any_group_records_nothing(lowered, monkeypatch):
    """A file the self-check cannot write (torch.jit.save on a full temp disk) stops it without a verdict;
    a case whose numbers differ is a verdict (test_a_failing_case_refuses_training_with_its_line)."""
    def full(folder):
        raise RuntimeError("[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(verify, "GROUPS", [verify.GROUPS[0], ("optimizers", full)])
    printed = []
    with pytest.raises(SetupError) as stopped:
        verify_command.run(printed.append)
    assert str(stopped.value) == messages.torch_self_check_unfinished(
        "optimizers", "RuntimeError: [enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing "
                      "file data/0: file write failed")
    assert printed[-1].startswith(f"  {'optimizers':<16} not run: RuntimeError: "), printed
    assert not (lowered / torch_gate.FOLDER).exists() or not list((lowered / torch_gate.FOLDER).glob("*.json"))


@pytest.mark.parametrize("kind", ["a file", "read-only"])
def test_a_cache_folder_the_gate_cannot_write_is_one_line_naming_gradbridge_cache_dir(regressor, tmp_path, kind):
    """Before: a bare "[Errno 20] Not a directory" or "[Errno 30] Read-only file system" line."""
    if kind == "a file":
        cache = tmp_path / "cache-file"
        cache.write_text("in the way")
        reason = messages.not_a_folder(str(cache))
    else:
        cache = tmp_path / "read-only"
        _mount(cache, "ro,size=64k")
        reason = "Read-only file system"
    work = tmp_path / "work"
    work.mkdir()
    try:
        result = _parity(regressor, work, cache)
    finally:
        if kind == "read-only":
            subprocess.run(["umount", str(cache)], check=True)
    assert result.returncode == 1 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        CLI_ERROR_PREFIX + messages.cache_unwritable(str(cache / torch_gate.FOLDER), reason)], result.stderr
    assert not list(work.iterdir())


def test_doctor_does_not_run_the_self_check_in_its_jvm_probe(tmp_path):
    """Before, doctor's JVM probe went through the torch gate: on an unchecked torch it ran the self-check
    (a minute), and when that failed, its progress lines were the "JVM start" problem."""
    cache = _cache(tmp_path)
    result = _gradbridge(["doctor"], tmp_path, cache, **_everywhere(tmp_path))
    rows = {line[:22].strip(): line[22:].strip() for line in result.stdout.splitlines()}
    assert rows["torch self-check"] == messages.torch_unchecked_status(libtorch.torch_version(), LOWERED), rows
    assert rows["JVM start"].startswith("ok (Java "), result.stdout
    assert "checking it once" not in result.stdout + result.stderr
    assert not list(cache.glob(f"{torch_gate.FOLDER}/*.json"))


def test_doctor_reports_the_probes_error_not_its_progress_lines(tmp_path):
    cache = _cache(tmp_path)
    failing = ("import sys, gradbridge._runtime.native as n\nfrom gradbridge.errors import SetupError\n"
               "def ensure(quiet=False):\n"
               "    print('gradbridge: building gradbridge native library (once, ~30 s) ...', file=sys.stderr)\n"
               "    raise SetupError('building failed: g++: fatal error: killed')\n"
               "n.ensure = ensure")
    result = _gradbridge(["doctor"], tmp_path, cache, **_everywhere(tmp_path, failing))
    problems = [line for line in result.stdout.splitlines() if line.startswith("problem: ")]
    assert problems == ["problem: JVM start: a JVM does not start here: building failed: g++: fatal error: killed"], \
        result.stdout


# ---- when TorchScript goes ----

def _refuse(*args, **kwargs):
    raise RuntimeError("TorchScript has been removed; use torch.export")


def test_export_says_in_one_line_that_this_torch_refuses_scripting(monkeypatch, tmp_path, capsys):
    """format='torchscript' refuses in one line; the default (format='auto') exports protocol 3 instead."""
    from gradbridge.commands.main import main

    monkeypatch.setattr(torch.jit, "script", _refuse)
    expected = messages.torchscript_unavailable(
        torch.__version__, "torch.jit.script", "RuntimeError: TorchScript has been removed; use torch.export")
    x = torch.randn(4, 3)
    with pytest.raises(TorchScriptUnavailableError) as refused:  # no tracing fallback: nothing could be saved
        export_training_module(torch.nn.Linear(3, 1), "mse", "sgd", tmp_path / "m.pt", example_inputs=(x, x[:, :1]),
                               format="torchscript")
    assert str(refused.value) == expected
    assert main(["export", "linear-regression", "--output", str(tmp_path / "seed.pt"), "--format", "torchscript"]) == 1
    assert capsys.readouterr().err.splitlines() == [CLI_ERROR_PREFIX + expected]
    assert not list(tmp_path.iterdir())
    assert main(["export", "linear-regression", "--output", str(tmp_path / "seed.pt")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"wrote {tmp_path / 'seed.pt'} (protocol 3, torch.export: TorchScript cannot capture it)")
    capture = protocol.read_metadata(tmp_path / "seed.pt")["capture"]
    assert capture == {"kind": "export", "checked": True, protocol.DRAWS_RANDOM_KEY: False, protocol.AUTO_REASON_KEY: expected}


def test_loading_says_in_one_line_that_this_torch_refuses_torch_jit_load(monkeypatch, regressor):
    path, data = regressor
    monkeypatch.setattr(torch.jit, "load", _refuse)
    with pytest.raises(TorchScriptUnavailableError) as refused:
        reference.train(path, *np.load(data).values(), epochs=1)
    assert str(refused.value) == messages.torchscript_unavailable(
        torch.__version__, "torch.jit.load", "RuntimeError: TorchScript has been removed; use torch.export")


def test_verify_says_in_one_line_that_this_torch_refuses_torchscript(lowered, monkeypatch):
    monkeypatch.setattr(torch.jit, "script", _refuse)
    printed = []
    assert verify_command.run(printed.append) == 1
    expected = "TorchScript: " + messages.torchscript_unavailable(
        torch.__version__, "torch.jit.script", "RuntimeError: TorchScript has been removed; use torch.export")
    assert f"  {'TorchScript':<16} FAILED: {expected}" in printed, printed
    assert json.loads(torch_gate.verdict_path().read_text())["line"] == expected
