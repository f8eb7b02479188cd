"""`gradbridge serve`: the online-learning HTTP service (Java's ``gradbridge-serve``) from an installed wheel.

The Python process becomes the JVM (``exec``), so signals (SIGTERM drains and checkpoints), output
and the exit code are the service's own. Options: ``gradbridge serve --help``.
"""

from __future__ import annotations

import os
from typing import List, Sequence

from .._runtime import classpath, launcher

SERVE_MAIN = "dev.gradbridge.serve.ServeCommand"


def command(args: Sequence[str]) -> List[str]:
    """The command line that runs the service with ``args`` (library jars first, then the service's)."""
    return launcher.command(SERVE_MAIN, args, extra_classpath=classpath.resolve_serve())


def run(args: Sequence[str]) -> int:
    line = command(args)
    os.execv(line[0], line)
    return 1  # not reached
