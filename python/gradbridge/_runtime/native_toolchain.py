"""The C++ toolchain that builds gradbridge's native libraries (``native``): the compiler (``CXX``, else g++
or c++), the flags for this Python's torch and the JDK, the C++ files compiled side by side, then linked."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Tuple

from .. import messages
from ..errors import SetupError


def compiler(torch_version: str) -> Tuple[str, List[str]]:
    """The compiler and the words that run it (CXX="ccache g++" as make takes it); SetupError naming
    ``torch_version`` when there is none."""
    cxx = os.environ.get("CXX", "").strip() or None
    words = shlex.split(cxx) if cxx is not None else []
    found = (shutil.which(words[0]) if words else None) if cxx is not None \
        else shutil.which("g++") or shutil.which("c++")
    if found is None:
        raise SetupError(messages.no_compiler(cxx, torch_version))
    return found, [found, *words[1:]]


def cxx_standard(include: Path) -> str:
    """C++20 where ATen's headers demand it (torch 2.15's ATen.h refuses older standards), else C++17."""
    aten = (include / "ATen" / "ATen.h").read_text(encoding="utf-8", errors="replace")
    return "-std=c++20" if "C++20 or later" in aten else "-std=c++17"


def flags(include: Path, java_home: Path, cxx11_abi: int, sources: Dict[str, Path]) -> List[str]:
    """The compiler's flags for torch's headers in ``include`` and its C++ ABI, the sources' headers
    (``sources``: ``native``'s dict) and the JDK's."""
    found = [cxx_standard(include), "-O2", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi}",
             f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
             f"-I{sources['header'].parent}", f"-I{sources['support'].parent}",
             f"-I{java_home / 'include'}", f"-I{java_home / 'include' / 'linux'}"]
    if "gloo_headers" in sources:
        # ProcessGroupGloo.hpp declares its classes only with USE_C10D_GLOO (as torch was built).
        found += ["-DUSE_C10D_GLOO", f"-isystem{sources['gloo_headers']}"]
    return found


def compile_and_link(compiler_args: List[str], flags: List[str], cpp_files: List[Path], scratch: Path, output: Path,
                     lib_dir: Path) -> List[Tuple[int, str]]:
    """Each step's exit code and stderr: the files compile side by side in ``scratch``, as many at once as
    there are cores (each compiler holds libtorch's headers, ~0.7 GB), then, all compiled, link into
    ``output`` against libtorch in ``lib_dir``."""
    objects = [scratch / f"{cpp.stem}.o" for cpp in cpp_files]
    # The compiler's temp files go to the scratch folder too: a disk that is full is the cache folder's.
    environment = {**os.environ, "TMPDIR": str(scratch)}

    def compile_one(cpp: Path, obj: Path) -> Tuple[int, str]:
        done = subprocess.run([*compiler_args, *flags, "-c", str(cpp), "-o", str(obj)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment)
        return done.returncode, done.stderr

    with ThreadPoolExecutor(max_workers=max(1, min(len(cpp_files), os.cpu_count() or 1))) as pool:
        results = list(pool.map(compile_one, cpp_files, objects))
    if all(code == 0 for code, _ in results):
        link = subprocess.run([*compiler_args, "-shared", *map(str, objects), "-o", str(output),
                               # No rpath: Java loads libc10 and libtorch_cpu first, from the folder it was given.
                               "-Wl,--as-needed", f"-L{lib_dir}", "-ltorch_cpu", "-lc10"],
                              capture_output=True, text=True, env=environment)
        results.append((link.returncode, link.stderr))
    return results
