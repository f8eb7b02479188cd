"""Atomic writes for the files gradbridge writes from Python for the user: modules, histories,
state dicts, parity and gradcheck reports, bench results and charts. (Not through here: the
bench's own scratch inputs, the native library's build, which renames from a scratch folder, and
`recover-log`, which writes a new folder that it refuses to overwrite.)

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

from ..errors import WriteError  # also importable from here, as before


def _refused(target: Path, ex: OSError) -> WriteError:
    return WriteError(f"{target}: cannot write it: {ex.strerror or ex}")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a new empty temp file to fill; on success it replaces ``path``, else it is removed.

    An OSError on the way (folder, temp file, rename, the body's writes) becomes a WriteError
    naming ``path``."""
    target = Path(path)
    tmp = _create_temp(target)
    try:
        yield tmp
        if target.is_file():
            os.chmod(tmp, target.stat().st_mode & 0o7777)  # replacing must not change who may read it
        os.replace(tmp, target)
    except OSError as ex:
        tmp.unlink(missing_ok=True)
        if isinstance(ex, WriteError):
            raise
        raise _refused(target, ex) from ex
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_writable(path: str | os.PathLike) -> None:
    """Refuse (WriteError) an output that could not be written, before any work is done for it."""
    target = Path(path)
    if target.is_dir():
        raise WriteError(f"{target}: cannot write it: Is a directory")
    if target.parent.is_dir():
        _create_temp(target).unlink()
        return
    folder = next(f for f in target.parents if f.exists())  # creates no folder for a check
    if not folder.is_dir():
        raise WriteError(f"{target}: cannot write it: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise WriteError(f"{target}: cannot write it: {folder} is not writable")


def _create_temp(target: Path) -> Path:
    for folder in target.parents:  # mkdir would say "File exists" of a file on the way
        if folder.exists():
            if not folder.is_dir():
                raise WriteError(f"{target}: cannot write it: {folder} is not a directory")
            break
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        while True:
            tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
            try:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))  # 0666 minus the umask
                return tmp
            except FileExistsError:
                continue
    except OSError as ex:
        raise _refused(target, ex) from ex
