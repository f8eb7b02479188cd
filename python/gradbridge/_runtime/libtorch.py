"""The torch releases gradbridge supports, the libtorch that Java runs on, and the system
properties that select it.

The supported range is the torch line of ``requirements.txt`` (the wheel's dependencies): a lower
end only, so that pip never refuses or downgrades a newer torch; a torch below it is refused with one
line before any JVM starts. ``VERIFIED_TORCH`` beside it names the newest minor release the project
ran its whole version matrix on ("verified up to"); a newer torch needs a passing self-check on the
machine it runs on first (``gradbridge._runtime.torch_gate``).

In this process Java must use the libtorch that ``import torch`` loaded (one libtorch per process),
through gradbridge's native library built for that torch (``gradbridge._runtime.native``, which reads this module, never the reverse). A separate JVM uses
the libtorch of the ``pytorch-native-cpu`` jar when its classpath has one (a checkout's Gradle build;
the jar's own native library is built for it), else this Python's libtorch (an installed wheel).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from ..errors import SetupError

#: gradbridge's run-time requirements (the wheel's too); its torch line is the supported range.
REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"
#: One line, a minor release ("2.15"): the newest torch the project verified (every release of it).
VERIFIED = Path(__file__).resolve().parents[1] / "VERIFIED_TORCH"


@lru_cache(maxsize=None)
def supported() -> str:
    """The torch releases gradbridge supports, as pip writes them: ``torch>=2.7.1``."""
    from packaging.requirements import Requirement

    for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#") and Requirement(line).name == "torch":
            return line.strip()
    raise SetupError(f"{REQUIREMENTS} names no torch requirement; reinstall gradbridge")


@lru_cache(maxsize=None)
def verified_up_to() -> str:
    """The newest torch minor release the project ran its whole version matrix on: "2.15" (so 2.15.x)."""
    text = VERIFIED.read_text(encoding="utf-8").strip() if VERIFIED.is_file() else ""
    if not re.fullmatch(r"\d+\.\d+", text):
        raise SetupError(f"{VERIFIED} holds {text!r}, expected a minor release such as 2.15: reinstall gradbridge")
    return text


def is_verified(version: str) -> bool:
    """Whether torch ``version`` is in the range and no newer than :func:`verified_up_to` (any patch release)."""
    from packaging.version import Version

    mark = Version(verified_up_to())
    return in_range(version) and Version(release(version)).release[:2] <= mark.release[:2]


def release(version: str) -> str:
    """A torch version without its local suffix ("2.7.1" for "2.7.1+cpu"): what the range, the
    native library's build and a module's metadata name."""
    return version.split("+")[0]


def in_range(version: str) -> bool:
    """Whether torch ``version`` (a local suffix such as "+cpu" is ignored) is a supported release."""
    from packaging.requirements import Requirement

    return Requirement(supported()).specifier.contains(release(version), prereleases=True)


def require_supported() -> str:
    """The installed torch's version; SetupError naming the range when it is outside."""
    installed = torch_version()
    if not in_range(installed):
        raise SetupError(f"torch {installed} is installed, but gradbridge supports {supported()}: "
                         f"pip install '{supported()}'")
    return installed


def torch_version() -> str:
    """The installed torch's version without a local suffix ("2.7.1" for "2.7.1+cpu")."""
    import torch

    return release(torch.__version__)


def lib_dir() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent / "lib"
