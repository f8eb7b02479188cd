"""Run a checkout's Gradle build from Python (development only: the benchmark and the tests use it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Sequence

from ..errors import GradbridgeError
from . import devtree as _devtree


def program_args(words: Sequence[str]) -> str:
    """Join words for ``-Pargs=...``; the build splits it again, keeping quoted words together."""
    quoted = []
    for word in map(str, words):
        if '"' in word and "'" in word:
            raise ValueError(f"cannot pass {word!r} through -Pargs: it holds both quote kinds")
        quoted.append(word if word and not any(c.isspace() for c in word) and '"' not in word and "'" not in word
                      else (f"'{word}'" if '"' in word else f'"{word}"'))
    return " ".join(quoted)


def gradle_command() -> str:
    gradle = shutil.which("gradle")
    if gradle is None:
        raise GradbridgeError("gradle is not installed: run the README set-up (make setup) or `apt-get install gradle`")
    return gradle


def run_task(tasks: str | Sequence[str], args: Sequence[str] = (), *, capture: bool = True) -> subprocess.CompletedProcess:
    """``gradle -q TASKS -Pargs=...`` in the repository, with this interpreter as the build's Python."""
    tasks = [tasks] if isinstance(tasks, str) else list(tasks)
    command = [gradle_command(), "--no-daemon", "-q", *tasks, f"-Ppython={sys.executable}"]
    if args:
        command.append(f"-Pargs={program_args(args)}")
    return subprocess.run(command, cwd=_devtree.require_root("gradle " + " ".join(tasks)), text=True, capture_output=capture, check=False)
