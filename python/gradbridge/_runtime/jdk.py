"""The Java runtime gradbridge uses: which JDK, where, and whether it is new enough.

The in-process JVM (JPype) loads ``GRADBRIDGE_JVM`` or the libjvm that JPype finds (JAVA_HOME,
then the system's); a separate JVM runs ``$JAVA_HOME/bin/java``, else ``java`` on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from ..errors import SetupError

#: The jars are compiled for Java 17 (Spark 4 needs it too).
MIN_JAVA = 17
#: The libjvm.so to load in this process instead of the one JPype finds.
JVM_PATH_ENV = "GRADBRIDGE_JVM"
_VERSION = re.compile(r'version "([^"]+)"')


def feature_version(version: str) -> int:
    """17 for "17.0.15", 8 for "1.8.0_392"."""
    parts = re.findall(r"\d+", version)
    if not parts:
        raise SetupError(f"cannot read a Java version from {version!r}")
    major = int(parts[0])
    return int(parts[1]) if major == 1 and len(parts) > 1 else major


def _release_version(java_home: Path) -> Optional[str]:
    """JAVA_VERSION from the JDK's ``release`` file, without starting anything."""
    release = java_home / "release"
    if release.is_file():
        match = re.search(r'^JAVA_VERSION="([^"]+)"', release.read_text(errors="replace"), re.MULTILINE)
        if match:
            return match.group(1)
    return None


def require(version: str, where: str) -> None:
    """SetupError naming ``where`` when ``version`` is older than MIN_JAVA."""
    if feature_version(version) < MIN_JAVA:
        raise SetupError(f"{where} is Java {version}; gradbridge needs Java {MIN_JAVA} or newer: "
                         f"install a JDK {MIN_JAVA}+ and set JAVA_HOME to it")


# ---- a separate JVM ----

def _java_home() -> Optional[Path]:
    """JAVA_HOME when set; SetupError when it holds no ``bin/java``: a JAVA_HOME that is wrong is
    refused, never passed over for another Java."""
    home = os.environ.get("JAVA_HOME")
    if not home:
        return None
    if not (Path(home) / "bin" / "java").is_file():
        raise SetupError(f"JAVA_HOME={home} holds no bin/java: point it at a JDK {MIN_JAVA}+ or unset it")
    return Path(home)


def java_executable() -> str:
    java_home = _java_home()
    if java_home is not None:
        return str(java_home / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise SetupError("no `java` found: install a JDK 17+ and put it on PATH or set JAVA_HOME")
    return found


def java_version(executable: str) -> str:
    """The version of ``executable`` (the JDK's release file, else ``java -version``)."""
    version = _release_version(Path(executable).resolve().parents[1])
    if version:
        return version
    try:
        result = subprocess.run([executable, "-version"], capture_output=True, text=True, timeout=60)
    except OSError as ex:
        raise SetupError(f"cannot run {executable}: {ex}") from ex
    match = _VERSION.search(result.stderr + result.stdout)
    if not match:
        raise SetupError(f"{executable} -version printed no version (exit code {result.returncode})")
    return match.group(1)


def checked_java() -> str:
    """The ``java`` to start, after checking its version."""
    executable = java_executable()
    require(java_version(executable), executable)
    return executable


# ---- the JVM in this process ----

def libjvm_path() -> str:
    """The libjvm the in-process JVM loads."""
    explicit = os.environ.get(JVM_PATH_ENV)
    if explicit:
        if not Path(explicit).is_file():
            raise SetupError(f"{JVM_PATH_ENV}={explicit}: no such file")
        return explicit
    java_home = _java_home()
    if java_home is not None:  # JPype would quietly look elsewhere when JAVA_HOME has no libjvm
        found = sorted(java_home.glob("**/libjvm.so"), key=lambda p: "server" not in p.parts)
        if not found:
            raise SetupError(f"JAVA_HOME={java_home} holds no libjvm.so for the JVM in this process: point it at "
                             f"a JDK {MIN_JAVA}+, set {JVM_PATH_ENV}, or unset JAVA_HOME")
        return str(found[0])
    import jpype

    try:
        return jpype.getDefaultJVMPath()
    except Exception as ex:  # JPype raises its own JVMNotFoundException
        raise SetupError(f"no JVM found for this process ({ex}): install a JDK {MIN_JAVA}+ "
                         f"and set JAVA_HOME or {JVM_PATH_ENV}") from ex


def libjvm_version(libjvm: str) -> Optional[str]:
    """The version of the JDK holding ``libjvm`` (``<home>/lib/server/libjvm.so``), if it says."""
    path = Path(libjvm).resolve()
    for home in path.parents[:4]:
        version = _release_version(home)
        if version:
            return version
    return None
