"""The libtorch that Java runs on, and the system properties that select it.

In this process Java must use the libtorch that ``import torch`` loaded (one libtorch per process),
through gradbridge's native library built for that torch (``gradbridge.native``). A separate JVM uses
the libtorch of DJL's ``pytorch-native-cpu`` jar when its classpath has one (a checkout's Gradle build;
the jar's own native library is built for it), else this Python's libtorch (an installed wheel).
"""

from __future__ import annotations

from pathlib import Path
from typing import List


def torch_version() -> str:
    """The installed torch's version without a local suffix ("2.7.1" for "2.7.1+cpu")."""
    import torch

    return torch.__version__.split("+")[0]


def lib_dir() -> Path:
    import torch

    return Path(torch.__file__).resolve().parent / "lib"


def java_options(use_torch_lib: bool = True) -> List[str]:
    """System properties for Java: this Python's libtorch and the native library built for it (by default),
    else none (Java then takes libtorch from the pytorch-native jar on its classpath)."""
    if not use_torch_lib:
        return []
    from . import native

    return native.jvm_options()
