"""Custom C++ operators: build a library, load it, and find the operators a module needs.

A module that calls ``torch.ops.NS.NAME`` records those operators in its metadata
(``custom_ops``). Nothing ever takes a library *path* from a .pt file: the user names the
libraries (``--op-library FILE``; ``TrainingModule.load(path, libraries)`` in Java), and a missing
one is one error naming the operator and that option.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence

from . import messages
from .files import atomic_path
from .errors import GradbridgeError, ModuleLoadError

#: Namespaces of libtorch's own operators: anything else in a scripted graph is a custom operator.
_BUILTIN_NAMESPACES = frozenset({"aten", "prim", "profiler", "quantized", "onnx", "cuda", "_caffe2", "torchvision",
                                 "_quantized", "quantized_decomposed", "mkldnn", "mkl", "_c10d_functional",
                                 "c10d", "tensorexpr", "attr", "scope", "upgraders", "debug"})


#: ELF, Mach-O (both byte orders, 32/64-bit, universal); PE starts with "MZ".
_LIBRARY_MAGIC = {b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xfe\xed\xfa\xce",
                  b"\xca\xfe\xba\xbe"}


def build(sources: Sequence[str | os.PathLike], output: str | os.PathLike, *, name: str | None = None) -> Path:
    """Compile C++ operator sources into a shared library at ``output`` (CPU, g++ through
    ``torch.utils.cpp_extension``, no CUDA toolkit), against this Python's libtorch."""
    from torch.utils import cpp_extension

    output = Path(output)
    missing = [str(s) for s in sources if not Path(s).is_file()]
    if missing:
        raise GradbridgeError(f"no such C++ source: {', '.join(missing)}")
    name = name or output.stem.removeprefix("lib")
    with tempfile.TemporaryDirectory(prefix="gradbridge-op-") as build_dir:
        try:
            built = cpp_extension.load(name=name, sources=[str(s) for s in sources], is_python_module=False,
                                       build_directory=build_dir, extra_cflags=["-O2"], verbose=False)
        except (RuntimeError, OSError, ValueError) as ex:
            raise GradbridgeError(f"cannot build {', '.join(map(str, sources))}: {str(ex).strip().splitlines()[-1]}") from ex
        with atomic_path(output) as tmp:
            shutil.copyfile(built, tmp)
    return output


def load(libraries: Iterable[str | os.PathLike]) -> List[Path]:
    """Load operator libraries into this process (``torch.ops.load_library``)."""
    import torch

    loaded = []
    for library in libraries:
        path = Path(library).resolve()
        if not path.is_file():
            raise ModuleLoadError(messages.op_library_unloadable(str(library), "no such file"))
        with open(path, "rb") as file:
            head = file.read(4)
        if head not in _LIBRARY_MAGIC and head[:2] != b"MZ":
            raise ModuleLoadError(messages.op_library_unloadable(str(library), "not a shared library"))
        try:
            torch.ops.load_library(str(path))
        except OSError as ex:
            raise ModuleLoadError(messages.op_library_unloadable(str(library), str(ex))) from ex
        loaded.append(path)
    return loaded


def used_by(scripted) -> List[str]:
    """The custom operators (``NS::NAME``) a scripted module calls, from every method's graph."""
    found = set()

    def visit(block) -> None:
        for node in block.nodes():
            namespace = node.kind().split("::", 1)[0]
            if namespace not in _BUILTIN_NAMESPACES:
                found.add(node.kind())
            for inner in node.blocks():
                visit(inner)

    import torch

    for name in scripted._c._method_names():
        graph = scripted._c._get_method(name).graph.copy()
        torch._C._jit_pass_inline(graph)  # calls into submodules become their nodes
        visit(graph)
    return sorted(found)


def prepare(metadata: Dict[str, Any], libraries: Iterable[str | os.PathLike], where: str) -> None:
    """Load ``libraries``, then check that they provide every custom operator the module calls."""
    load(libraries)
    require(metadata.get("custom_ops", ()), where)


def require(operators: Iterable[str], where: str) -> None:
    """ModuleLoadError naming the first operator that no loaded library provides."""
    import torch

    for operator in operators:
        if not torch._C._jit_get_schemas_for_operator(operator):
            raise ModuleLoadError(messages.missing_custom_op(where, operator))
