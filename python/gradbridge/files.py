"""Atomic writes for every file gradbridge writes from Python (models, histories).

A temporary file beside the target, then a rename: a reader never sees half a file. The temp
file is created like any other file, so the user's umask applies (``tempfile.mkstemp`` makes
0600 files); an existing target keeps its permissions. Java's ``AtomicFiles`` does the same and
removes ``.<name>.<id>.tmp`` leftovers of a killed run before writing the same target.
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a new empty temp file to fill; on success it replaces ``path``, else it is removed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))  # 0666 minus the umask
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        if target.is_file():
            os.chmod(tmp, target.stat().st_mode & 0o7777)  # replacing must not change who may read it
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
