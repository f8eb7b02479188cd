"""Paths inside a gradbridge source checkout: used only in development.

An installed wheel has no checkout; everything here returns None or raises there. The library
asks this module only where a checkout changes where the Java build lives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

_CANDIDATE = Path(__file__).resolve().parents[3]


def root() -> Optional[Path]:
    """The checkout this package is imported from, or None for an installed package."""
    if (_CANDIDATE / "settings.gradle").is_file() and (_CANDIDATE / "python" / "gradbridge").is_dir():
        return _CANDIDATE
    return None


def require_root(what: str) -> Path:
    """The checkout, or GradbridgeError saying that ``what`` needs one."""
    from ..errors import SetupError

    checkout = root()
    if checkout is None:
        raise SetupError(f"{what} runs from a gradbridge source checkout, not from an installed package")
    return checkout


#: What `gradle assemble` writes in a checkout: the runtime classpath of the Java library.
CLASSPATH_FILE = "build/gradbridge-classpath.txt"
BUILD_COMMAND = "gradle assemble"
