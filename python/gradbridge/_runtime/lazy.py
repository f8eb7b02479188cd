"""Names a package imports on first use (PEP 562), so that importing it stays light and no import
circle forms through its ``__init__``."""

import importlib
import sys


def attributes(package: str, lazy: dict):
    """The module ``__getattr__`` of ``package``: each name of ``lazy`` (name -> submodule, relative)
    imported from its submodule on first use, then kept in the package's namespace."""

    def __getattr__(name):
        if name in lazy:
            value = getattr(importlib.import_module(f".{lazy[name]}", package), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
