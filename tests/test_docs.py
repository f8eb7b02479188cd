"""The docs point at what exists: every repo path and `path:line` in docs/*.md and README.md, every
`{@link X#y}` in the Java sources and the docs; docs/architecture.md stays a map; a default the prose
repeats is the constant's value."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO_ROOT / "docs").glob("*.md")) + [REPO_ROOT / "README.md"]
JAVA_TREES = ("java", "programs", "serve", "spark", "examples", "buildSrc")

#: docs/architecture.md is the map (what each part is, how data flows); design records live in the guides.
ARCHITECTURE_LINES = 700

#: Where a relative path in the docs may start: the repo root, the Python package (`spec/optim.py`), the
#: Java library's package (`online/OnlineLearner.java`), docs/ itself (a guide linking a guide).
BASES = ("", "python/gradbridge", "java/src/main/java/dev/gradbridge", "docs")
#: Folders the first component of a repo path names: the repo's own top level and the package's subfolders.
REPO_FOLDERS = {p.name for p in REPO_ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} | {
    p.name for p in (REPO_ROOT / "python/gradbridge").iterdir() if p.is_dir() and not p.name.startswith("_")
    or p.name == "_runtime"} | {"online", "data", "internal"}
#: Outputs and places outside the checkout that the docs name on purpose (never in the repo).
NOT_IN_REPO = {"build", "jars", "libs", ".venv", ".venv-newest", ".venv-spark", "site-packages", "cache"}
SOURCE_SUFFIXES = {".py", ".java", ".cpp", ".h", ".gradle", ".toml", ".md", ".json", ".properties", ".txt", ".sh",
                   ".kt", ".cfg", ".ini", ".yml", ".yaml", ".in"}
#: Source file names in backticks that are not the repo's: torch's, transformers', Spark's, a user's.
FOREIGN_FILES = {
    "version.py",            # a pip torch's torch/version.py (NativeLibrary reads libtorch's version from it)
    "modeling_t5.py", "modeling_bart.py",  # transformers' sources, named by the export's refusal lines
    "ProcessGroupGloo.hpp",  # torch's c10d header
    "my_models.py", "train.py", "my_net.py", "model.py",  # a user's files in the examples
}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def _files_by_name() -> dict:
    """Every tracked-looking file of the checkout by file name (outputs and venvs left out)."""
    skip = {".git", ".gradle", "build", "node_modules", "__pycache__"}
    found: dict = {}
    for path in REPO_ROOT.rglob("*"):
        rel = path.relative_to(REPO_ROOT)
        if any(part in skip or part.startswith(".venv") for part in rel.parts) or not path.is_file():
            continue
        found.setdefault(path.name, []).append(path)
    return found


def _resolve(ref: str) -> Path | None:
    """The repo file or folder a doc's path names, or None; `...` stands for any folders."""
    ref = ref.rstrip("/")
    for base in BASES:
        if "..." in ref:
            head, _, tail = ref.partition("...")
            for match in (REPO_ROOT / base / head.rstrip("/")).glob("**/" + tail.lstrip("/")):
                return match
        else:
            for candidate in (REPO_ROOT / base / ref, REPO_ROOT / base / (ref + ".py")):  # `export/__init__`
                if candidate.exists():
                    return candidate
    return None


def _looks_like_repo_path(token: str) -> bool:
    if not re.fullmatch(r"[\w./-]+", token) or token.startswith(("/", "~", "http", "-")) or "//" in token:
        return False
    parts = [p for p in token.split("/") if p not in ("", ".", "..")]
    if len(parts) < 2 and not token.endswith("/"):
        return False
    if parts and parts[0] in ("dev", "torch", "transformers", "org", "com"):  # jar resources and other trees
        return False
    if any(p in NOT_IN_REPO or p.startswith(".venv") for p in parts):
        return False
    if not parts or parts[0] not in REPO_FOLDERS:
        return False
    return Path(parts[-1]).suffix in SOURCE_SUFFIXES or token.endswith("/") or "." not in parts[-1]


def _backticked(text: str):
    """(line number, token) of each word inside backticks (code blocks included: they name files too)."""
    for number, line in enumerate(text.splitlines(), 1):
        for span in re.findall(r"`([^`]+)`", line):
            for token in re.split(r"[\s,;()'\"=]+", span):
                token = token.rstrip(".:")
                if token:
                    yield number, token


def _doc_id(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_repo_path_in_the_docs_exists(doc):
    missing = []
    for number, token in _backticked(_text(doc)):
        token = token.split("#")[0]
        ref = token.split(":")[0] if re.search(r":\d", token) else token
        if _looks_like_repo_path(ref) and _resolve(ref) is None:
            missing.append(f"{_doc_id(doc)}:{number}: {token}")
        elif "/" not in ref and Path(ref).suffix in {".py", ".java", ".cpp", ".h", ".gradle"} \
                and re.fullmatch(r"[\w.-]+", ref) and ref not in FOREIGN_FILES and ref not in _files_by_name():
            missing.append(f"{_doc_id(doc)}:{number}: {token} (no file of that name)")
    # markdown links to files of the checkout, and to their headings
    for number, line in enumerate(_text(doc).splitlines(), 1):
        for link in re.findall(r"\]\(([^)\s]+)\)", line):
            target, _, anchor = link.partition("#")
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            path = (doc.parent / target) if target else doc
            if not path.exists():
                missing.append(f"{_doc_id(doc)}:{number}: link {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                missing.append(f"{_doc_id(doc)}:{number}: link {link}: no such heading")
    assert not missing, "\n".join(missing)


def _anchors(markdown: Path) -> set:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as dashes."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", _text(markdown), flags=re.DOTALL), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_path_line_reference_is_inside_its_file(doc):
    wrong = []
    for number, line in enumerate(_text(doc).splitlines(), 1):
        for ref, lines in re.findall(r"([\w./-]+\.\w+):(\d+(?:[-,]\d+)*)\b", line):
            if not _looks_like_repo_path(ref) and ref not in _files_by_name():
                continue  # another project's file (transformers/models/t5/modeling_t5.py:2067)
            target = _resolve(ref) if "/" in ref else (_files_by_name().get(ref) or [None])[0]
            if target is None or not target.is_file():
                wrong.append(f"{_doc_id(doc)}:{number}: {ref} does not exist")
                continue
            length = len(_text(target).splitlines())
            for n in map(int, re.split(r"[-,]", lines)):
                if not 1 <= n <= length:
                    wrong.append(f"{_doc_id(doc)}:{number}: {ref}:{n} is past its {length} lines")
    assert not wrong, "\n".join(wrong)


def test_architecture_stays_a_map():
    lines = len(_text(REPO_ROOT / "docs/architecture.md").splitlines())
    assert lines <= ARCHITECTURE_LINES, f"docs/architecture.md has {lines} lines: move design records to the guides"


# --- {@link X#y} -------------------------------------------------------------------------------------

def _java_files():
    for tree in JAVA_TREES:
        yield from (REPO_ROOT / tree).rglob("*.java")


@lru_cache(maxsize=None)
def _java_by_class() -> dict:
    """Top-level class name -> its source files (by file name: one public type per file)."""
    found: dict = {}
    for path in _java_files():
        if "build" not in path.relative_to(REPO_ROOT).parts:
            found.setdefault(path.stem, []).append(path)
    return found


def _package_of(text: str) -> str:
    match = re.search(r"^package ([\w.]+);", text, re.MULTILINE)
    return match.group(1) if match else ""


#: java.lang types the Javadoc names unqualified and unimported (any other unknown name is a missing class)
JAVA_LANG = {"Boolean", "Double", "Float", "Integer", "Long", "String", "Object", "Thread", "Runtime", "Math",
             "System", "AutoCloseable", "Iterable", "Exception", "RuntimeException", "Error", "Throwable",
             "IllegalStateException", "IllegalArgumentException", "OutOfMemoryError", "InterruptedException",
             "UnsupportedOperationException", "Comparable", "Enum", "Class", "StringBuilder", "Character", "Byte",
             "Short", "Number", "Void", "Override", "Deprecated", "FunctionalInterface", "SafeVarargs"}


def _java_source(name: str, context: str, here: Path | None) -> Path | None | str:
    """The source file of the class a link names (simple, nested or qualified), "external" for a type that is
    not the repo's (the JDK, Spark, picocli, ...), or None when it names a type that does not exist."""
    by_class = _java_by_class()
    if name[0].islower():  # qualified: dev.gradbridge.online.OnlineLearner.Builder
        if not name.startswith("dev.gradbridge."):
            return "external"
        parts = name.split(".")
        outer = next((j for j, part in enumerate(parts) if part[0].isupper()), None)
        if outer is None:  # a package
            return "external" if any(_package_of(_text(p)) == name for files in by_class.values() for p in files) \
                else None
        files = [p for p in by_class.get(parts[outer], []) if _package_of(_text(p)) == ".".join(parts[:outer])]
        return files[0] if files else None
    outer = name.split(".")[0]
    candidates = by_class.get(outer, [])
    if here is None:  # a doc: a class of the repo by that name
        return candidates[0] if candidates else None
    # Java's scope: a type declared in this file (a nested one shadows the package's), a single-type import,
    # the file's own package, an on-demand import, java.lang
    if re.search(rf"\b(class|interface|enum|record) {outer}\b", context):
        return here
    imported = re.search(rf"^import ([\w.]+)\.{outer};", context, re.MULTILINE)
    if imported and not imported.group(1).startswith("dev.gradbridge"):
        return "external"
    on_demand = re.findall(r"^import ([\w.]+)\.\*;", context, re.MULTILINE)
    for package in [imported.group(1)] if imported else [_package_of(context)] + on_demand:
        same = [p for p in candidates if _package_of(_text(p)) == package]
        if same:
            return same[0]
    if imported:
        return None
    if outer in JAVA_LANG or any(not package.startswith("dev.gradbridge") for package in on_demand):
        return "external"
    return None


#: {@link X#y}, {@linkplain ...}, {@value ...} (a Javadoc line break, "*", may come after the tag) and @see X#y
LINK = re.compile(r"\{@(?:link|linkplain|value)\s+(?:\*\s*)?([\w.]*)(?:#(\w+))?[^}]*\}|@see\s+([\w.]*)#(\w+)")


def _links():
    for path in list(_java_files()) + DOCS:
        if "build" in path.relative_to(REPO_ROOT).parts:
            continue
        text = _text(path)
        for match in LINK.finditer(text):
            name, member = (match.group(1), match.group(2)) if match.group(3) is None and match.group(4) is None \
                else (match.group(3), match.group(4))
            yield path, text, text.count("\n", 0, match.start()) + 1, name or "", member


def test_every_javadoc_link_names_an_existing_class_and_member():
    wrong = []
    for path, text, number, name, member in _links():
        where = f"{path.relative_to(REPO_ROOT)}:{number}"
        here = path if path.suffix == ".java" else None
        if not name:
            target = here
        else:
            target = _java_source(name, text, here)
        if target == "external":
            continue
        if target is None:
            wrong.append(f"{where}: {{@link {name}}}: no such class in the repo")
            continue
        if member and not re.search(rf"\b{member}\b", _text(target)):
            wrong.append(f"{where}: {{@link {name}#{member}}}: {target.relative_to(REPO_ROOT)} has no {member}")
    assert not wrong, "\n".join(wrong)


# --- defaults the prose repeats ----------------------------------------------------------------------

#: The online learner's options by flag: the docs may say their defaults anywhere (no other command has them).
ONLINE_FLAGS = {
    "--max-batch": "DEFAULT_MAX_BATCH", "--max-wait-ms": "DEFAULT_MAX_WAIT_MILLIS",
    "--publish-every": "DEFAULT_PUBLISH_EVERY", "--checkpoint-every": "DEFAULT_CHECKPOINT_EVERY",
    "--queue-capacity": "DEFAULT_QUEUE_CAPACITY", "--predictors": "DEFAULT_PREDICTORS", "--fsync": "DEFAULT_FSYNC",
    "--group-commit-ms": "DEFAULT_GROUP_COMMIT_MILLIS", "--max-grad-norm": "DEFAULT_MAX_GRAD_NORM",
    "--max-input-abs": "DEFAULT_MAX_INPUT_ABS", "--keep-versions": "DEFAULT_KEEP_VERSIONS",
    "--gate-max-regression": "DEFAULT_GATE_MAX_REGRESSION", "--gate-on-hold": "DEFAULT_GATE_ON_HOLD",
}
#: Sentences that repeat a default in words of their own: (doc, pattern capturing the value, constant). Each must
#: still be found, so a reworded sentence is looked at again.
PROSE_DEFAULTS = [
    ("docs/online.md", r"`--seed`, default (\w+)", "DEFAULT_SEED"),
    ("docs/online.md", r"`--gate-on-hold (\w+)`, the default", "DEFAULT_GATE_ON_HOLD"),
    ("docs/online.md", r"serving version's plus X \(default ([\w.]+): no worse\)", "DEFAULT_GATE_MAX_REGRESSION"),
    ("docs/online.md", r"`--max-grad-norm G` \((off) by default\)", "DEFAULT_MAX_GRAD_NORM"),
    ("docs/online.md", r"`--group-commit-ms` \(with fsync\s+always, [^()]*?, default (\w+):", "DEFAULT_GROUP_COMMIT_MILLIS"),
    ("docs/spark.md", r"`seed` is the run's `--seed` \((\w+) by\s+default", "DEFAULT_SEED"),
]


def _same(said: str, value) -> bool:
    said = said.replace(",", "").replace("_", "")
    if said == "off":
        return value == 0
    if isinstance(value, str):
        return said == value
    try:
        return float(said) == float(value)
    except ValueError:
        return False


def test_a_default_the_docs_repeat_is_the_constants_value():
    from gradbridge import protocol

    wrong = []
    for doc in DOCS:
        text = _text(doc)
        for match in re.finditer(r"`(--[\w-]+)[^`]*`\s*\((?:[^()]*?; )?default:? ([\w.+-]+)", text):
            flag, said = match.groups()
            if flag in ONLINE_FLAGS and not _same(said, getattr(protocol, ONLINE_FLAGS[flag])):
                wrong.append(f"{_doc_id(doc)}: {match.group(0)!r}: protocol.{ONLINE_FLAGS[flag]} is "
                             f"{getattr(protocol, ONLINE_FLAGS[flag])!r}")
    for doc, pattern, name in PROSE_DEFAULTS:
        found = re.findall(pattern, _text(REPO_ROOT / doc))
        if not found:
            wrong.append(f"{doc}: no longer says /{pattern}/ (update PROSE_DEFAULTS)")
        wrong += [f"{doc}: /{pattern}/ says {said}, protocol.{name} is {getattr(protocol, name)!r}"
                  for said in found if not _same(said, getattr(protocol, name))]
    assert not wrong, "\n".join(wrong)


# --- Class.member and module.name in backticks --------------------------------------------------------

#: Words before a dot that are not a module or class of the repo here: Java package names, metadata keys, files.
NOT_OWNERS = {"data", "online", "internal", "cli", "bench", "examples", "spark", "serve", "capture", "gradle", "torch",
              "np", "numpy", "os", "sys", "jpype", "java", "javax", "org", "com", "dev", "scala", "transformers"}
FILE_SUFFIXES = {"properties", "key", "png", "json", "jsonl", "py", "md", "txt", "npz", "npy", "pt", "so", "jar", "log",
                 "lock", "bin", "csv", "toml", "gradle", "java", "cpp", "h", "hpp", "xml", "conf", "sh", "values", "tmp"}


@lru_cache(maxsize=None)
def _python_modules() -> dict:
    found: dict = {}
    for path in (REPO_ROOT / "python/gradbridge").rglob("*.py"):
        found.setdefault(path.stem, []).append(path)
    return found


@lru_cache(maxsize=None)
def _python_classes() -> dict:
    found: dict = {}
    for path in (REPO_ROOT / "python/gradbridge").rglob("*.py"):
        for name in re.findall(r"^\s*class (\w+)", _text(path), re.MULTILINE):
            found.setdefault(name, []).append(path)
    return found


def test_every_class_member_and_module_name_in_the_docs_exists():
    """`TrainingModule.saveCheckpoint`, `messages.batch_size`: the class (Java's, or Python's of that name) or the
    gradbridge module holds the member (it occurs in its source)."""
    wrong = []
    for doc in DOCS:
        for number, line in enumerate(_text(doc).splitlines(), 1):
            for span in re.findall(r"`([^`]+)`", line):
                for match in re.finditer(r"(?<![\w./-])([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b(?![.(/-]?\w*/)", span):
                    owner, member = match.groups()
                    if member in FILE_SUFFIXES or member.endswith("_") or owner in NOT_OWNERS:
                        continue
                    if owner[0].isupper():
                        files = _java_by_class().get(owner, []) + _python_classes().get(owner, [])
                    else:
                        files = _python_modules().get(owner, [])
                    if files and not any(re.search(rf"\b{member}\b", _text(f)) for f in files):
                        wrong.append(f"{_doc_id(doc)}:{number}: {owner}.{member}")
    assert not wrong, "\n".join(wrong)
