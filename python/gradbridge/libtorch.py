"""The torch releases gradbridge supports, the libtorch that Java runs on, and the DJL settings
that select it.

The supported range is the torch line of ``requirements.txt`` (the wheel's dependencies); a torch
outside it is refused with one line before any JVM starts.

In this process Java must use the libtorch that ``import torch`` loaded (one libtorch per
process). A separate JVM uses DJL's own build when a ``pytorch-native-*`` jar is on its
classpath (a checkout's Gradle build), else the same pip libtorch (an installed wheel).
Either way DJL runs offline: a missing native library is an error, never a download.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import List

from .errors import SetupError

#: gradbridge's run-time requirements (the wheel's too); its torch line is the supported range.
REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"


@lru_cache(maxsize=None)
def supported() -> str:
    """The torch releases gradbridge supports, as pip writes them: ``torch>=2.7.1,<2.16``."""
    from packaging.requirements import Requirement

    for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#") and Requirement(line).name == "torch":
            return line.strip()
    raise SetupError(f"{REQUIREMENTS} names no torch requirement; reinstall gradbridge")


def in_range(version: str) -> bool:
    """Whether torch ``version`` (a local suffix such as "+cpu" is ignored) is a supported release."""
    from packaging.requirements import Requirement

    return Requirement(supported()).specifier.contains(version.split("+")[0], prereleases=True)


def require_supported() -> str:
    """The installed torch's version; SetupError naming the range when it is outside."""
    installed = torch_version()
    if not in_range(installed):
        raise SetupError(f"torch {installed} is installed, but gradbridge supports {supported()}: "
                         f"pip install '{supported()}'")
    return installed


def require_for_jvm(built_for: str, *, on_this_libtorch: bool) -> None:
    """The check before a JVM starts: the supported range; and, where Java runs on this Python's
    libtorch (in this process, or a separate JVM without DJL's own libtorch), DJL's build of it."""
    require_supported()
    if on_this_libtorch:
        require_djl_build(built_for)


def torch_version() -> str:
    """The installed torch's version without a local suffix ("2.7.1" for "2.7.1+cpu")."""
    import torch

    return torch.__version__.split("+")[0]


def lib_dir() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent / "lib"


# DJL's JNI library (0.36.0-libdjl_torch.so) imports libtorch C++ symbols of the one release it was
# built for (93 of its 430 are missing from 2.15.0), so Java may run on this Python's libtorch only
# when that is DJL's release. Only Java needs this: export, the reference, gradcheck and
# `parity --java subprocess` from a checkout (DJL's own libtorch) run on any torch in the range.
# gradbridge's own native layer, built against the running torch, deletes this function and its call.
def require_djl_build(pinned: str) -> None:
    """SetupError when the installed torch is not the release DJL's native library was built for."""
    installed = torch_version()
    if installed != pinned:
        raise SetupError(f"torch {installed} is installed, but Java on this Python's libtorch runs through DJL's "
                         f"native library, which needs libtorch {pinned}: pip install torch=={pinned}")


def djl_options(use_torch_lib: bool = True) -> List[str]:
    """System properties for DJL: offline, and (by default) on this Python's libtorch."""
    options = ["-Dai.djl.offline=true"]
    if use_torch_lib:
        options += [f"-DPYTORCH_LIBRARY_PATH={lib_dir()}", f"-DPYTORCH_VERSION={torch_version()}",
                    "-DPYTORCH_FLAVOR=cpu"]
    return options
