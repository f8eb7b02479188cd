"""The machine: ``gradbridge bench``, custom operator libraries, the native layer and its cache, devices."""

from __future__ import annotations

from typing import Any, Optional, Sequence


# ---- gradbridge bench ----

BENCH_ROUNDS = "rounds (an integer from 2 to 10000)"
BENCH_THREADS = "threads (an integer from 1 to 1024)"
ENV_ASSIGNMENT = "environment assignment (NAME=VALUE)"


def bench_needs(case: str, package: str) -> str:
    return f"bench case {case} needs the {package} package, which is not installed here: pip install {package}"


def bench_choice(what: str, allowed: Sequence[str]) -> str:
    """argparse's name for a comma-separated choice ("invalid <this> value: 'x'")."""
    return f"{what} (comma-separated, from {', '.join(allowed)})"


# ---- custom operators ----

def missing_custom_op(module: str, operator: str) -> str:
    return (f"{module} uses the custom operator {operator}, which no loaded library provides: "
            f"load its library first with --op-library FILE")


def op_library_unloadable(library: str, reason: str) -> str:
    return f"--op-library {library}: cannot load it: {reason}"


# why a file is not a shared library for this machine (checked before the dynamic linker maps it:
# a truncated library kills the process with SIGBUS instead of failing)

NOT_ELF = "not an ELF shared library"
ELF_TYPES = {0: "an ELF file of no type", 1: "a relocatable object (.o)", 2: "an executable", 4: "a core dump"}


def elf_class(bits: int) -> str:
    return f"a {bits}-bit ELF file; this machine loads 64-bit little-endian libraries"


def elf_type(e_type: int) -> str:
    return f"{ELF_TYPES.get(e_type, f'an ELF file of type {e_type}')}, not a shared library"


def elf_machine(found: int, machine: str, expected: int) -> str:
    return f"built for ELF machine {found}; this machine is {machine} (ELF machine {expected})"


def elf_truncated(needed: int, size: int) -> str:
    return f"truncated: its headers need {needed} bytes, the file has {size}"


# ---- the native layer: gradbridge's native library and its cache (Java: Messages, same sentences) ----

CACHE_ENV = "GRADBRIDGE_CACHE_DIR"


def digest_mismatch(recorded: str, actual: str) -> str:
    return f"its SHA-256 is {actual}, not the {recorded} recorded when it was built (damaged or replaced)"


def cache_damaged(what: str, folder: str, reason: str, action: str) -> str:
    return f"gradbridge: the cached {what} in {folder} is damaged ({reason}): {action}"


def cache_unwritable(folder: str, reason: str) -> str:
    return (f"cannot write gradbridge's cache folder {folder} ({CACHE_ENV}, by default ~/.cache/gradbridge): "
            f"{reason}; set {CACHE_ENV} to a writable folder")


def not_a_folder(path: str) -> str:
    """The reason for a cache folder under a path that is a file (GRADBRIDGE_CACHE_DIR naming one)."""
    return f"{path} is a file, not a folder"


def no_compiler(cxx: str | None, torch_version: str) -> str:
    if cxx is not None:
        return (f"CXX={cxx} names no compiler (not a file and not on PATH), needed to build gradbridge's native "
                f"library for torch {torch_version}: set CXX to a C++ compiler such as g++, or unset it")
    return (f"no C++ compiler to build gradbridge's native library for torch {torch_version}: install g++ "
            f"(e.g. apt-get install g++) or set CXX to one")


def jvm_options_refused(where: str, reason: str) -> str:
    """A JVM that does not start with the user's extra options (``GRADBRIDGE_JVM_OPTIONS=...``)."""
    return f"a JVM does not start with {where}: {reason}; correct or unset GRADBRIDGE_JVM_OPTIONS"


# ---- devices: where a module trains (Java: Messages, the same sentences) ----

#: The environment cuBLAS reads for reproducible results (set before CUDA starts), and its value on CUDA runs.
CUBLAS_WORKSPACE_CONFIG = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE_VALUE = ":4096:8"


def unknown_device(device: Any) -> str:
    return f"unknown device '{device}'; expected cpu, cuda or cuda:N"


def device_unavailable(device: str, reason: str) -> str:
    return f"{device} is not available: {reason}"


def cuda_devices_seen(libtorch: str, count: int, driver: bool) -> str:
    seen = f"this libtorch ({libtorch}) sees {count} CUDA device{'' if count == 1 else 's'}"
    if count > 0:
        return f"{seen} (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
    return seen + ("" if driver else " (no NVIDIA driver: libcuda.so.1 does not load)")


def cuda_cpu_build(libtorch: str) -> str:
    return (f"this libtorch ({libtorch}) is a CPU build (no libtorch_cuda.so): use a CUDA build (pip's torch on "
            "Linux; for a JVM of its own, GRADBRIDGE_LIBTORCH=its torch/lib)")


def cuda_unloadable(file: str, reason: str) -> str:
    return f"cannot load {file}: {reason}"


def cublas_config_late(value: Optional[str]) -> str:
    """CUDA started in this process before the run set cuBLAS's workspace (Python only: a warning)."""
    return (f"CUDA started in this process before {CUBLAS_WORKSPACE_CONFIG} was set "
            f"({'unset' if value is None else repr(value)}): cuBLAS may not be reproducible; set "
            f"{CUBLAS_WORKSPACE_CONFIG}={CUBLAS_WORKSPACE_VALUE} before torch uses CUDA")
