"""May this torch train? The one gate before every run that trains or compares, and the verdicts of
the self-check (``gradbridge verify``) it relies on for a torch newer than the project verified.

- A torch below the supported range's lower end: refused (``libtorch.require_supported``).
- A torch up to ``libtorch.verified_up_to()`` (the newest minor release the project ran its whole
  version matrix on): runs, unless ``gradbridge verify`` failed for it on this machine.
- A newer torch: runs once this torch build passed ``gradbridge verify`` on this machine. Its verdict
  is recorded per torch build (version + a hash of what identifies the build) and gradbridge version
  in ``<cache>/selfcheck/``; the first use of an unchecked build runs the self-check in a process of
  its own (one line says so), unless ``GRADBRIDGE_AUTO_VERIFY=0``, which refuses it until
  ``gradbridge verify`` has run (a CI step). A failed self-check refuses that build with its line.

Callers: ``jvm.start`` (in-process Java: ``java.train``, the pytest plugin's fixtures, ``gradcheck``),
``launcher.command`` (a JVM of its own: ``parity --java subprocess``, ``serve``),
``sparkrun.command`` (gradbridge-spark), and before they write or train anything ``gradbridge parity``,
``gradcheck.check`` and ``gradbridge demo``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from . import libtorch
from .. import messages
from .._version import __version__
from ..errors import CLI_ERROR_PREFIX, SetupError

#: "0": an unchecked torch newer than the verified releases is refused (run `gradbridge verify` first)
#: instead of being self-checked on its first use.
AUTO_ENV = "GRADBRIDGE_AUTO_VERIFY"
#: The folder under the cache folder (native.cache_dir) that holds one verdict per torch build.
FOLDER = "selfcheck"

#: True while this process runs the self-check itself (its cases train through the gated entry points).
_checking = False


@dataclass(frozen=True)
class TorchBuild:
    """The installed torch build: its version (with the local suffix) and a hash of what tells builds
    apart (version, git commit, C++ ABI, the size of libtorch_cpu.so)."""
    version: str
    build_hash: str

    @property
    def name(self) -> str:
        return f"torch{libtorch.release(self.version)}-{self.build_hash}"


def torch_build() -> TorchBuild:
    import torch

    core = libtorch.lib_dir() / "libtorch_cpu.so"
    identity = "\0".join([torch.__version__, str(getattr(torch.version, "git_version", "")),
                          str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
                          str(core.stat().st_size if core.is_file() else -1)])
    return TorchBuild(torch.__version__, hashlib.sha256(identity.encode()).hexdigest()[:16])


def verdict_path(build: Optional[TorchBuild] = None) -> Path:
    from .native import cache_dir

    return cache_dir() / FOLDER / f"{(build or torch_build()).name}.json"


def read_verdict(build: Optional[TorchBuild] = None) -> Optional[dict]:
    """This build's verdict from this gradbridge version, or None (none yet, unreadable, another version's)."""
    try:
        verdict = json.loads(verdict_path(build).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(verdict, dict) or verdict.get("gradbridge") != __version__ or "passed" not in verdict:
        return None
    return verdict


def record(passed: bool, line: str, seconds: float, build: Optional[TorchBuild] = None) -> Path:
    """Write this build's verdict (atomically)."""
    from .files import atomic_path

    build = build or torch_build()
    path = verdict_path(build)
    verdict = {"gradbridge": __version__, "torch": build.version, "build_hash": build.build_hash, "passed": passed,
               "line": line, "seconds": round(seconds, 1), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    from .native import cache_unwritable

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(verdict, indent=2) + "\n", encoding="utf-8")
    except OSError as ex:  # WriteError too: the cache folder is the user's setting to correct
        raise cache_unwritable(path.parent, ex.__cause__ if isinstance(ex.__cause__, OSError) else ex) from ex
    return path


@contextmanager
def checking() -> Iterator[None]:
    """The self-check's own runs pass the gate (they are what decides it)."""
    global _checking
    previous, _checking = _checking, True
    try:
        yield
    finally:
        _checking = previous


def status() -> str:
    """For ``gradbridge doctor``: verified, self-checked, failed or not checked yet, in words."""
    version = libtorch.require_supported()
    verdict = read_verdict()
    if verdict is not None and not verdict["passed"]:
        raise SetupError(messages.torch_self_check_failed(version, verdict["line"]))
    passed = f"`gradbridge verify` passed here {verdict['date']}" if verdict else None
    if libtorch.is_verified(version):
        return (f"verified (the project's matrix ran on every release up to {libtorch.verified_up_to()}.x)"
                + (f"; {passed}" if passed else ""))
    if verdict is None:
        return messages.torch_unchecked_status(version, libtorch.verified_up_to())
    return f"self-checked on this machine ({passed}, in {verdict['seconds']} s)"


def require_torch() -> str:
    """The gate: the installed torch's version when it may train here; else SetupError in one line.

    A newer torch than the verified ones without a verdict is self-checked now (``gradbridge verify``
    in a process of its own, its progress on stderr), unless ``GRADBRIDGE_AUTO_VERIFY=0``."""
    version = libtorch.require_supported()
    if _checking:
        return version
    verdict = read_verdict()  # a failed self-check refuses even a verified release: this machine differs
    if verdict is None and libtorch.is_verified(version):
        return version
    if verdict is None:
        if os.environ.get(AUTO_ENV, "").strip() == "0":
            raise SetupError(messages.torch_unchecked(version, libtorch.verified_up_to(), AUTO_ENV))
        verdict = _self_check(version)
    if not verdict["passed"]:
        raise SetupError(messages.torch_self_check_failed(version, verdict["line"]))
    return version


def _self_check(version: str) -> dict:
    """Run ``gradbridge verify`` once for this build (one process at a time: a lock beside the verdicts)."""
    import fcntl

    from .native import cache_subfolder, cache_unwritable

    build = torch_build()
    path = verdict_path(build)
    cache_subfolder(path.parent)
    try:
        lock = open(path.with_suffix(".lock"), "w")
    except OSError as ex:  # a read-only folder
        raise cache_unwritable(path.parent, ex) from ex
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process checking this build: wait for its verdict
        verdict = read_verdict(build)
        if verdict is not None:
            return verdict
        print(f"gradbridge: {messages.torch_self_check_starts(version, libtorch.verified_up_to())}",
              file=sys.stderr, flush=True)
        last = ""
        try:
            scratch = tempfile.TemporaryDirectory(prefix="gradbridge-verify-")
        except OSError as ex:  # a full temp folder: nothing checked, nothing recorded
            raise SetupError(messages.torch_self_check_incomplete(version, f"{ex.filename}: {ex.strerror}")) from ex
        with scratch as folder:
            with subprocess.Popen([sys.executable, "-m", "gradbridge", "verify"], cwd=folder,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
                for line in process.stdout:
                    if not line.startswith(CLI_ERROR_PREFIX):  # its error line: said once, in the gate's line
                        sys.stderr.write(line)
                    last = line.strip() or last
        verdict = read_verdict(build)
    if verdict is None:  # e.g. a full disk: its one line (without the command's prefix), nothing recorded
        reason = last[len(CLI_ERROR_PREFIX):] if last.startswith(CLI_ERROR_PREFIX) else " ".join(last.split())
        raise SetupError(messages.torch_self_check_incomplete(version, reason or f"exit code {process.returncode}"))
    return verdict
