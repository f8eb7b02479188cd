"""The Java library's borders: every public type is documented API or listed as internal
(docs/java-api.md), every package says what it is, no package is split over two jars, and the
Javadoc of the library, gradbridge-serve and gradbridge-spark builds without a warning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gradbridge._runtime.devtree import root
from gradbridge._runtime.gradle import run_task

REPO_ROOT = Path(root())
LIBRARY = REPO_ROOT / "java" / "src" / "main" / "java"
#: each jar's main sources (the library, the programs, gradbridge-serve, gradbridge-spark and its per-line sources)
JARS = {"gradbridge": [LIBRARY], "programs": [REPO_ROOT / "programs" / "src" / "main" / "java"],
        "serve": [REPO_ROOT / "serve" / "src" / "main" / "java"],
        "spark": sorted((REPO_ROOT / "spark" / "src").glob("*/java"))}
PUBLIC_TYPE = re.compile(r"^public (?:(?:final|abstract|sealed|non-sealed) )*(?:class|interface|enum|@interface|record) ",
                         re.MULTILINE)


def _package(source: Path) -> str:
    return re.search(r"^package ([\w.]+);", source.read_text(), re.MULTILINE).group(1)


def _listed() -> tuple[set[str], set[str], set[str]]:
    """(API types, internal types, internal packages) named in docs/java-api.md."""
    text = (REPO_ROOT / "docs" / "java-api.md").read_text()
    api, internal = text.split("## Internal", 1)
    names = lambda part: set(re.findall(r"`(dev\.gradbridge\.(?:[a-z]\w*\.)*[A-Z]\w*)`", part))  # noqa: E731
    return names(api), names(internal), set(re.findall(r"`(dev\.gradbridge\.[\w.]+)\.\*`", internal))


def test_every_public_library_type_is_listed():
    api, internal, internal_packages = _listed()
    public = {f"{_package(f)}.{f.stem}" for f in LIBRARY.rglob("*.java") if PUBLIC_TYPE.search(f.read_text())}
    assert public, "no public type found: the pattern is wrong"
    unlisted = sorted(t for t in public - api - internal if t.rsplit(".", 1)[0] not in internal_packages)
    assert not unlisted, f"public library types in neither list of docs/java-api.md: {unlisted}"
    assert not api & internal, api & internal
    assert not sorted((api | internal) - public), "listed but not a public library type"
    assert not [t for t in api if t.rsplit(".", 1)[0] in internal_packages]


def test_every_package_has_a_package_info_and_none_is_split():
    owners: dict[str, set[str]] = {}
    for jar, folders in JARS.items():
        for folder in folders:
            for source in folder.rglob("*.java"):
                owners.setdefault(_package(source), set()).add(jar)
    split = {package: sorted(jars) for package, jars in owners.items() if len(jars) > 1}
    assert not split, f"packages declared by two jars: {split}"
    missing = sorted(package for package in owners
                     if not any((folder / package.replace(".", "/") / "package-info.java").exists()
                                for jar in owners[package] for folder in JARS[jar]))
    assert not missing, f"packages without a package-info.java: {missing}"


@pytest.mark.gradle
def test_javadoc_builds_without_warnings():
    # build.gradle: doclint on (but missing comments) and -Werror for the three, so a warning fails the task
    result = run_task([":javadoc", ":serve:javadoc", ":spark:javadoc"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning" not in result.stdout + result.stderr
