"""The libtorch that Java runs on, and the DJL settings that select it.

In this process Java must use the libtorch that ``import torch`` loaded (one libtorch per
process). A separate JVM uses DJL's own build when a ``pytorch-native-*`` jar is on its
classpath (a checkout's Gradle build), else the same pip libtorch (an installed wheel).
Either way DJL runs offline: a missing native library is an error, never a download.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

from .errors import SetupError


def torch_version() -> str:
    """The installed torch's version without a local suffix ("2.7.1" for "2.7.1+cpu")."""
    import torch

    return torch.__version__.split("+")[0]


def lib_dir() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent / "lib"


def require(pinned: str) -> None:
    """SetupError when the installed torch is not the version the Java library runs."""
    installed = torch_version()
    if installed != pinned:
        raise SetupError(f"torch {installed} is installed, but this gradbridge's Java library (DJL) runs "
                         f"libtorch {pinned}: pip install torch=={pinned}")


def djl_options(use_torch_lib: bool = True) -> List[str]:
    """System properties for DJL: offline, and (by default) on this Python's libtorch."""
    options = ["-Dai.djl.offline=true"]
    if use_torch_lib:
        options += [f"-DPYTORCH_LIBRARY_PATH={lib_dir()}", f"-DPYTORCH_VERSION={torch_version()}",
                    "-DPYTORCH_FLAVOR=cpu"]
    return options
