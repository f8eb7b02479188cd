"""`gradbridge bench`: runs every benchmark (``gradbridge.bench``) and prints its tables."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict, Sequence


def run(*, out_dir: str | os.PathLike, java_options: Sequence[str] = (), java_env: Dict[str, str] | None = None,
        java_cpus: str | None = None, out: Callable[[str], None] = print, **options) -> int:
    """``options``: those of ``gradbridge.bench.run`` (quick, rounds, cases, only, steps_only, threads,
    memory_steps)."""
    from ..bench import JavaSettings, run as run_benchmarks
    from ..bench.report import format_tables

    java = JavaSettings(options=list(java_options), env=dict(java_env or {}), cpus=java_cpus)
    results = run_benchmarks(out_dir=out_dir, java_settings=java, out=out, **options)
    for line in format_tables(results):
        out(line)
    out(f"\nwrote {Path(out_dir) / 'bench.json'} and {Path(out_dir) / 'bench.png'}")
    return 0
