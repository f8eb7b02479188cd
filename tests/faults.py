"""Helpers of the fault and bad-input suite (tests/test_faults_*.py).

The suite is organised by surface: module files, metadata, data files, CLI arguments, the
in-process API, threads, signals and disk. Every bad input must end with exit code 1 (or the
documented Python exception) and one line naming the file, key, array or argument, expected
versus actual: never a stack trace, never a JVM abort, never a stray file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gradbridge._runtime.devtree import root

REPO_ROOT = root()

TRAIN_SCRIPT = REPO_ROOT / "build" / "install" / "gradbridge" / "bin" / "gradbridge-train"
PYTHON_SRC = REPO_ROOT / "python"


def train_cli(*args, **kwargs) -> subprocess.CompletedProcess:
    """``gradbridge-train`` (from ``gradle installDist``) in a separate JVM."""
    assert TRAIN_SCRIPT.exists(), f"{TRAIN_SCRIPT} is missing: run `gradle installDist`"
    return subprocess.run([str(TRAIN_SCRIPT), *map(str, args)], capture_output=True, text=True, **kwargs)


def gradbridge_cli(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``python -m gradbridge`` with this checkout's package first on the path (``env``: more variables)."""
    import os

    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join([str(PYTHON_SRC), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "gradbridge", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env)


def one_error_line(result: subprocess.CompletedProcess, prefix: str = "error: ") -> str:
    """The single error line of a failed run (exit code 1, no stack trace); returns it without ``prefix``."""
    text = result.stderr
    assert result.returncode == 1, f"exit code {result.returncode}\n{result.stdout}\n{text}"
    assert "Traceback" not in text and "\tat " not in text and "Exception in thread" not in text, text
    errors = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(errors) == 1, text
    return errors[0][len(prefix):]


def minimal_elf(payload: bytes = b"") -> bytes:
    """An ELF64 shared-object header for this machine with no program or section headers, then ``payload``:
    a file that passes the ELF checks but is never meant to be loaded."""
    import platform
    import struct

    from gradbridge._runtime.ops import ELF_MACHINES

    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, ELF_MACHINES.get(platform.machine().lower(), 62), 1, 0, 0, 0,
                                 0, 64, 56, 0, 64, 0, 0)
    return header + payload


def stray_files(folder: Path, keep=()) -> list:
    """Files in ``folder`` other than ``keep`` (names)."""
    return sorted(p.name for p in Path(folder).iterdir() if p.name not in set(keep))


def rewrite_metadata(source: Path, target: Path, edit) -> Path:
    """Copy a .pt with its gradbridge.json replaced by ``edit(document)`` (which returns the new
    document, or a string to store verbatim). Every other record is copied as it is."""
    import json
    import zipfile

    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as copy:
        for info in original.infolist():
            content = original.read(info)
            if info.filename.endswith("/extra/gradbridge.json"):
                document = edit(json.loads(content))
                content = (document if isinstance(document, str) else json.dumps(document)).encode()
            copy.writestr(info.filename, content)
    return Path(target)
