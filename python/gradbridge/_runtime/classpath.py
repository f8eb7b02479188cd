"""Where the Java library's jars come from, and which versions they were built with.

In order: ``GRADBRIDGE_CLASSPATH`` (entries separated by os.pathsep), the Gradle build of a
source checkout (``build/gradbridge-classpath.txt``), the jars inside an installed wheel
(``gradbridge/jars``, listed in order by ``classpath.txt``). Every problem is one
JavaBuildMissingError line that names the fix.

The in-process JVM also hosts the user's own Java code: :func:`user_entries` adds their jars and
class folders after gradbridge's own.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from . import devtree as _devtree
from ..errors import JavaBuildMissingError, SetupError

#: Overrides every other source of gradbridge's own jars: entries separated by os.pathsep.
CLASSPATH_ENV = "GRADBRIDGE_CLASSPATH"
#: The user's jars and class folders, added after gradbridge's own: entries separated by os.pathsep.
USER_CLASSPATH_ENV = "GRADBRIDGE_USER_CLASSPATH"
#: The jars a wheel carries (`make dist` fills it; absent in a checkout).
BUNDLED_JARS = Path(__file__).resolve().parents[1] / "jars"
BUNDLE_INDEX = "classpath.txt"
#: Written into the library jar by the build (Java: dev.gradbridge.Versions).
VERSIONS_RESOURCE = "dev/gradbridge/versions.properties"
#: The pytorch-native-cpu jar: libtorch's shared libraries only (DJL's distribution of them; no DJL code
#: runs). Without one, a separate JVM runs this Python's libtorch.
NATIVE_JAR_PREFIX = "pytorch-native-"


@dataclass(frozen=True)
class Classpath:
    entries: List[str]
    #: where the entries came from, in words (for errors and `gradbridge doctor`)
    source: str

    @property
    def has_native_libtorch(self) -> bool:
        return any(Path(e).name.startswith(NATIVE_JAR_PREFIX) for e in self.entries)

    def library_jar(self) -> Path:
        """The gradbridge jar (or classes folder) on this classpath: the entry holding the versions resource."""
        return self._library()[0]

    def versions(self) -> Dict[str, str]:
        """``{"gradbridge": ..., "torch": ...}`` as the library was built (torch: what the jar's native library is for)."""
        entry, text = self._library()
        versions = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        missing = [key for key in ("gradbridge", "torch") if not versions.get(key)]
        if missing:
            raise JavaBuildMissingError(f"{entry}: {VERSIONS_RESOURCE} lacks {', '.join(missing)}; rebuild the Java library")
        return versions

    def _library(self) -> Tuple[Path, str]:
        for entry in map(Path, self.entries):
            if entry.is_dir() and (entry / VERSIONS_RESOURCE).is_file():
                return entry, (entry / VERSIONS_RESOURCE).read_text(encoding="utf-8")
            if entry.is_file() and entry.suffix == ".jar":
                try:
                    with zipfile.ZipFile(entry) as jar:
                        if VERSIONS_RESOURCE in jar.namelist():
                            return entry, jar.read(VERSIONS_RESOURCE).decode("utf-8")
                except (zipfile.BadZipFile, OSError) as ex:
                    raise JavaBuildMissingError(f"the classpath from {self.source} names {entry}, which is not a "
                                                f"readable jar ({ex})") from ex
        raise JavaBuildMissingError(f"the classpath from {self.source} holds no gradbridge jar "
                                    f"(none contains {VERSIONS_RESOURCE})")


def read_listing(listing: Path, what: str = "the Java library") -> List[str]:
    """The entries of a checkout's classpath file (Gradle writes them, os.pathsep between), each checked
    to exist; JavaBuildMissingError naming the file and `gradle assemble` otherwise. ``what`` names the
    build it belongs to."""
    fix = f"build it with `{_devtree.BUILD_COMMAND}` in {_devtree.root()}"
    if not listing.is_file():
        raise JavaBuildMissingError(f"{what} is not built: {listing} is missing; {fix}")
    return _checked([e for e in listing.read_text(encoding="utf-8").strip().split(os.pathsep) if e],
                    str(listing), fix)


def resolve() -> Classpath:
    """The classpath the JVM gets; JavaBuildMissingError when it is missing or incomplete."""
    text = os.environ.get(CLASSPATH_ENV)
    if text:
        source, fix = f"${CLASSPATH_ENV}", f"correct or unset {CLASSPATH_ENV}"
        entries = [e for e in text.strip().split(os.pathsep) if e]
    elif _devtree.root() is not None:
        listing = _devtree.root() / _devtree.CLASSPATH_FILE
        return Classpath(read_listing(listing), str(listing))
    else:
        index = BUNDLED_JARS / BUNDLE_INDEX
        source = f"the jars of the installed package ({BUNDLED_JARS})"
        fix = ("reinstall gradbridge from a wheel built with `make dist`, "
               f"or point {CLASSPATH_ENV} at the jars")
        if not index.is_file():
            raise JavaBuildMissingError(f"this gradbridge install has no Java library: {index} is missing; {fix}")
        entries = [str(BUNDLED_JARS / name) for name in index.read_text(encoding="utf-8").split()]
    return Classpath(_checked(entries, source, fix), source)


def _checked(entries: List[str], source: str, fix: str) -> List[str]:
    if not entries:
        raise JavaBuildMissingError(f"the classpath from {source} is empty; {fix}")
    missing = [e for e in entries if not Path(e).exists()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise JavaBuildMissingError(f"the classpath from {source} names files that do not exist: {shown}; {fix}")
    return entries


def check_entries(entries: Sequence[str | os.PathLike], source: str) -> List[str]:
    """``entries`` as absolute paths; SetupError naming the first one that does not exist and where it came from.

    ``dir/*`` (every jar in dir, as Java and JPype read it) needs only ``dir``.
    """
    if isinstance(entries, (str, os.PathLike)):  # one entry, not a string's characters
        entries = [entries]
    checked = []
    for entry in map(os.fspath, entries):
        path = Path(entry)
        if not (path.parent if path.name == "*" else path).exists():
            raise SetupError(f"the classpath entry {entry} (from {source}) does not exist: build it, "
                             "or correct the entry")
        checked.append(os.path.abspath(entry))
    return checked


def user_entries(extra: Sequence[str | os.PathLike] = (), source: str = "jvm.start(extra_classpath=...)") -> List[str]:
    """The user's classpath for the in-process JVM: what ``jpype.addClassPath`` added, then
    ``GRADBRIDGE_USER_CLASSPATH``, then ``extra`` (from ``source``). Each is checked to exist."""
    import jpype

    added = [e for e in jpype.getClassPath(env=False).split(os.pathsep) if e]
    from_env = [e for e in os.environ.get(USER_CLASSPATH_ENV, "").split(os.pathsep) if e]
    return (check_entries(added, "jpype.addClassPath") + check_entries(from_env, f"${USER_CLASSPATH_ENV}")
            + check_entries(extra, source))


#: Overrides where `gradbridge serve` finds the HTTP service's own jars (entries separated by os.pathsep).
SERVE_CLASSPATH_ENV = "GRADBRIDGE_SERVE_CLASSPATH"
#: The service's jars inside a wheel (`make dist`: Gradle's :serve:bundleServeJars).
BUNDLED_SERVE_JARS = BUNDLED_JARS / "serve"
#: The service's installDist folder of a source checkout.
DEV_SERVE_LIB = Path("serve") / "build" / "install" / "gradbridge-serve" / "lib"


def resolve_serve() -> List[str]:
    """The jars `gradbridge serve` adds to ``resolve()``: ``GRADBRIDGE_SERVE_CLASSPATH``, the checkout's
    ``serve/build/install`` (``gradle :serve:installDist``), or the wheel's ``gradbridge/jars/serve``."""
    text = os.environ.get(SERVE_CLASSPATH_ENV)
    if text:
        entries, source = [e for e in text.strip().split(os.pathsep) if e], f"${SERVE_CLASSPATH_ENV}"
    elif _devtree.root() is not None:
        lib = _devtree.root() / DEV_SERVE_LIB
        if not lib.is_dir():
            raise JavaBuildMissingError(f"the service is not built: {lib} is missing; build it with "
                                        f"`gradle :serve:installDist` in {_devtree.root()}")
        entries, source = sorted(str(p) for p in lib.glob("*.jar")), str(lib)
    else:
        index = BUNDLED_SERVE_JARS / BUNDLE_INDEX
        if not index.is_file():
            raise JavaBuildMissingError(f"this gradbridge install has no HTTP service: {index} is missing; reinstall "
                                        f"gradbridge from a wheel built with `make dist`, or point {SERVE_CLASSPATH_ENV} "
                                        "at the jars")
        entries, source = [str(BUNDLED_SERVE_JARS / n) for n in index.read_text(encoding="utf-8").split()], str(index)
    missing = [e for e in entries if not Path(e).exists()]
    if not entries or missing:
        raise JavaBuildMissingError(f"the service's classpath from {source} is empty or names missing files: "
                                    f"{', '.join(missing[:3])}")
    return entries
