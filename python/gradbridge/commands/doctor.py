"""`gradbridge doctor`: what this installation runs on, and one line per problem.

Checks: the Python package, where the Java library's jars come from and their versions, torch
against the supported range, whether it is verified, self-checked here or failed its self-check
(``torch_gate.status``), its TorchScript status, the export formats it supports (TorchScript,
torch.export and the protocol-3 op-list version, and which one ``format="auto"`` takes), the native
library Java would use on this Python's libtorch, whether this torch is a CUDA build and the CUDA devices
it sees (none is no problem: runs train on the CPU), the JVM that would start in this process (started
in a process of its own with the user's JVM options, past the torch gate: doctor never runs the
self-check, its row says whether one ran), and the `java` a separate JVM would run. Exit code 1 when
any is off.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, List, Optional

from .._runtime import devtree as _devtree, classpath, devices, jdk, libtorch, native, torch_gate
from .._version import __version__
from ..errors import GradbridgeError


def run(out: Callable[[str], None] = print) -> int:
    problems: List[str] = []

    def check(label: str, probe: Callable[[], str]) -> Optional[str]:
        try:
            value = probe()
        except (GradbridgeError, ImportError, OSError) as ex:
            problems.append(f"{label}: {ex}")
            value = "PROBLEM (below)"
        out(f"{label:<22} {value}")
        return None if value == "PROBLEM (below)" else value

    checkout = _devtree.root()
    out(f"{'gradbridge':<22} {__version__} ({Path(__file__).resolve().parent}"
        f"{', source checkout ' + str(checkout) if checkout else ', installed package'})")
    out(f"{'python':<22} {sys.version.split()[0]} ({sys.executable})")

    built: dict = {}  # the Java library's versions, once it is found
    check("java library", lambda: _java_library(built))

    torch_ok = check("torch", _torch) is not None
    if torch_ok:
        check("torch self-check", torch_gate.status)
    if torch_ok:
        from .._runtime import torchscript

        check("TorchScript", torchscript.deprecation_status)
        check("export formats", _formats)
        check("native library", native.describe)
        check("CUDA", devices.describe)

    if check("JVM in this process", _in_process_jvm) is not None and built:
        check("JVM start", _start_jvm)

    check("java (separate JVM)", _separate_jvm)

    for problem in problems:
        out(f"problem: {problem}")
    if not problems:
        out("no problems found")
    return 1 if problems else 0


def _java_library(built: dict) -> str:
    """The Java library on the classpath, of this package's version; ``built`` gets its versions."""
    path = classpath.resolve()
    built.update(path.versions())
    if built.get("gradbridge") != __version__:
        raise GradbridgeError(f"the Java library is gradbridge {built.get('gradbridge')}, the Python package "
                              f"{__version__}: rebuild or reinstall so that they match")
    own = (f"libtorch {built['torch']} from the pytorch-native jar" if path.has_native_libtorch
           else "this Python's libtorch")
    return (f"{path.library_jar()} (from {path.source}; {len(path.entries)} entries; a separate JVM runs "
            f"{own})")


def _torch() -> str:
    """This Python's torch, within the supported range."""
    version = libtorch.require_supported()
    return f"{version} (supported: {libtorch.supported()}; libtorch: {libtorch.lib_dir()})"


def _in_process_jvm() -> str:
    """The JVM JPype starts in this process (its version read from libjvm before it starts)."""
    libjvm = jdk.libjvm_path()
    version = jdk.libjvm_version(libjvm)
    if version is None:
        return f"{libjvm} (version unknown until it starts)"
    jdk.require(version, libjvm)
    return f"{libjvm} (Java {version})"


def _separate_jvm() -> str:
    """The java executable a separate JVM runs."""
    java = jdk.java_executable()
    version = jdk.java_version(java)
    jdk.require(version, java)
    return f"{java} (Java {version})"


def _formats() -> str:
    """The formats this torch exports, each probed on a one-layer model; a problem only when neither works."""
    from .._runtime import oplist, torchscript
    from ..errors import ExportError, TorchScriptUnavailableError
    from ..export import protocol3_capture

    found, missing = [], []
    try:
        torchscript.require_available()
        found.append("torchscript (protocol 2)")
    except TorchScriptUnavailableError:
        missing.append("torchscript (see TorchScript)")
    try:
        protocol3_capture.capture_probe()
        found.append(f"export (protocol 3, torch.export, op-list version {oplist.VERSION})")
    except ExportError as ex:
        missing.append(f"export ({ex})")
    if not found:
        raise GradbridgeError(f"this torch exports in no format: {'; '.join(missing)}")
    auto = ("TorchScript where it captures the model, else protocol 3" if len(found) == 2
            else found[0].split(" ")[0])
    return f"{', '.join(found)}{'; not ' + ', '.join(missing) if missing else ''}; format='auto' takes {auto}"


#: Starts the in-process JVM as every command does (jvm.start: classpath, libtorch, options), past the torch
#: gate: the "torch self-check" row reports that (the gate would run the self-check here, a minute, on an
#: unchecked torch). gradbridge's progress lines (a native build) go to stdout; stderr holds the JVM's own lines
#: and the probe's one error line.
_JVM_PROBE = ("import sys\nfrom gradbridge import jvm, messages\nfrom gradbridge._runtime import torch_gate\n"
              "errors, sys.stderr = sys.stderr, sys.stdout\ntry:\n    with torch_gate.checking():\n"
              "        jvm.start()\nexcept Exception as ex:\n    print(messages.one_line(ex), file=errors)\n"
              "    sys.exit(1)\nprint(jvm.jclass('java.lang.System').getProperty('java.version'))\n")
#: How long the probe may take (a native library built on first use included).
PROBE_SECONDS = 300


def _start_jvm() -> str:
    """Start a JVM as the commands do, in a process of its own: GRADBRIDGE_JVM_OPTIONS that a JVM
    refuses (or that make it exit, such as -Xmx1k) would otherwise only show in each command."""
    import os
    import subprocess

    from ..jvm import JVM_OPTIONS_ENV

    options = os.environ.get(JVM_OPTIONS_ENV, "")
    where = f"with {JVM_OPTIONS_ENV}={options}" if options else "here"
    try:
        result = subprocess.run([sys.executable, "-c", _JVM_PROBE], capture_output=True, text=True,
                                timeout=PROBE_SECONDS, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GradbridgeError(f"a JVM does not start {where}: it did not start within {PROBE_SECONDS} s") from None
    if result.returncode != 0:
        # the JVM's own lines first (it prints them and may exit the process itself), else the probe's;
        # never gradbridge's progress lines (stdout)
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        if lines and lines[-1].startswith(f"a JVM does not start with {JVM_OPTIONS_ENV}="):
            raise GradbridgeError(lines[-1])  # jvm.check_options said it, in the commands' own words
        reason = "; ".join(lines[:2]) or f"exit code {result.returncode}"
        raise GradbridgeError(f"a JVM does not start {where}: {reason}"
                              + (f"; correct or unset {JVM_OPTIONS_ENV}" if options else ""))
    version = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "?"
    return f"ok (Java {version}{', ' + JVM_OPTIONS_ENV + '=' + options if options else ''})"
