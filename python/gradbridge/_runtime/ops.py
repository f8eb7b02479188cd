"""Custom C++ operators: build a library, load it, and find the operators a module needs.

A module that calls ``torch.ops.NS.NAME`` records those operators in its metadata
(``custom_ops``). Nothing ever takes a library *path* from a .pt file: the user names the
libraries (``--op-library FILE``; ``TrainingModule.load(path, libraries)`` in Java), and a missing
one is one error naming the operator and that option.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence

from .. import messages
from .files import atomic_path
from ..errors import GradbridgeError, ModuleLoadError

#: Namespaces of libtorch's own operators: anything else in a scripted graph is a custom operator.
_BUILTIN_NAMESPACES = frozenset({"aten", "prim", "profiler", "quantized", "onnx", "cuda", "_caffe2", "torchvision",
                                 "_quantized", "quantized_decomposed", "mkldnn", "mkl", "_c10d_functional",
                                 "c10d", "tensorexpr", "attr", "scope", "upgraders", "debug"})


#: ELF e_machine of each CPU this may run on (platform.machine(); Java's os.arch in OperatorLibraries)
ELF_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21, "s390x": 22}


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
            raise GradbridgeError(f"cannot build {', '.join(map(str, sources))}: {_first_error(str(ex))}") from ex
        with atomic_path(output) as tmp:
            shutil.copyfile(built, tmp)
    return output


def _first_error(output: str) -> str:
    """The compiler's (or linker's) first error line in ninja's output; else its last line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    for line in lines:
        if re.search(r"\b(fatal )?error\b:|undefined reference", line) and not line.startswith("ninja:"):
            return line
    return lines[-1] if lines else "the compiler failed"


def load(libraries: Iterable[str | os.PathLike]) -> List[Path]:
    """Load operator libraries into this process (``torch.ops.load_library``)."""
    import torch

    loaded = []
    for library in libraries:
        path = Path(library).resolve()
        if not path.is_file():
            raise ModuleLoadError(messages.op_library_unloadable(str(library), "no such file"))
        try:
            problem = library_problem(path)
        except OSError as ex:
            problem = f"cannot read it: {ex.strerror or ex}"
        if problem is not None:
            raise ModuleLoadError(messages.op_library_unloadable(str(library), problem))
        try:
            torch.ops.load_library(str(path))
        except OSError as ex:
            raise ModuleLoadError(messages.op_library_unloadable(str(library), str(ex))) from ex
        loaded.append(path)
    return loaded


def library_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not an ELF shared object this machine can map, or None: magic, 64-bit
    little-endian, ET_DYN, this CPU, and every header and loadable segment inside the file (the
    dynamic linker maps segments past the end of a truncated file, and touching them is SIGBUS).
    Other systems than Linux: not checked."""
    if not sys.platform.startswith("linux"):
        return None
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        header = file.read(64)
        if len(header) < 16 or header[:4] != b"\x7fELF":
            return messages.NOT_ELF
        if header[4] != 2 or header[5] != 1:  # EI_CLASS 64-bit, EI_DATA little-endian
            return messages.elf_class(32 if header[4] == 1 else 64)
        if len(header) < 64:
            return messages.elf_truncated(64, size)
        e_type, e_machine = struct.unpack_from("<HH", header, 16)
        e_phoff, e_shoff = struct.unpack_from("<QQ", header, 32)
        e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", header, 54)
        if e_type != 3:  # ET_DYN
            return messages.elf_type(e_type)
        machine = platform.machine()
        expected = ELF_MACHINES.get(machine.lower())
        if expected is not None and e_machine != expected:
            return messages.elf_machine(e_machine, machine, expected)
        needed = max(e_phoff + e_phnum * e_phentsize, e_shoff + e_shnum * e_shentsize if e_shoff else 0)
        if e_phnum and e_phentsize < 56:  # smaller than an Elf64_Phdr: not a real table
            return messages.NOT_ELF
        if needed > size:
            return messages.elf_truncated(needed, size)
        file.seek(e_phoff)
        table = file.read(e_phnum * e_phentsize)
    for i in range(e_phnum):
        p_type, _, p_offset = struct.unpack_from("<IIQ", table, i * e_phentsize)
        p_filesz = struct.unpack_from("<Q", table, i * e_phentsize + 32)[0]
        if p_type == 1 and p_offset + p_filesz > size:  # PT_LOAD
            needed = max(needed, p_offset + p_filesz)
    return messages.elf_truncated(needed, size) if needed > size else None


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
