"""The package's borders: the public modules users import (README, docs, examples) stay where they are;
runtime plumbing lives in gradbridge._runtime."""

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

import gradbridge

#: What the README, docs/ and examples/ tell users to import or run.
PUBLIC = [
    "from gradbridge import export_training_module, export_builtin, History, EpochRecord",
    "from gradbridge import compare_histories, ParityReport, GradbridgeError, InvalidInputError",
    "from gradbridge import reference, java, jvm, parity, protocol, errors, messages, history",
    "from gradbridge import online, replay, gradcheck, models",
    "from gradbridge.reference import Reference, train",
    "from gradbridge.pytest_plugin import assert_histories_match",
    "from gradbridge.export import export_training_module, export_builtin",
    "from gradbridge.commands.main import main",
    "from gradbridge.jvm import start",
    "from gradbridge.protocol import read_metadata",
    "from gradbridge import load_for_python",
]


@pytest.mark.parametrize("line", PUBLIC)
def test_a_public_import_works_in_a_fresh_interpreter(line):
    result = subprocess.run([sys.executable, "-c", line], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_native_build_command_java_names_still_runs():
    """Java's error lines, Gradle and the Makefile name `python -m gradbridge.native build`."""
    result = subprocess.run([sys.executable, "-m", "gradbridge.native", "build", "--help"], capture_output=True,
                            text=True)
    assert result.returncode == 0 and "--out" in result.stdout, result.stderr


def _import_graph():
    """Every gradbridge module -> the gradbridge modules it imports, at the top or inside a function, and
    the packages above them that Python runs first (importing ``export.capture`` runs ``export/__init__``)."""
    package = Path(gradbridge.__file__).parent
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        packages = {".".join(target.split(".")[:i]) for target in targets for i in range(1, target.count(".") + 1)}
        targets |= {package for package in packages if not (name + ".").startswith(package + ".")}
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def test_no_import_circle():
    """Dependencies go one way, lazy imports included (a function-level import hides a circle, it does
    not remove it)."""
    assert not [cycle for cycle in nx.simple_cycles(nx.DiGraph(
        [(name, target) for name, targets in _import_graph().items() for target in targets]))]


#: Modules every part may read, themselves reading only _runtime's file helpers (history's atomic save).
SHARED = {"gradbridge.errors", "gradbridge.messages", "gradbridge.protocol", "gradbridge._version",
          "gradbridge.history"}


def test_no_circle_between_parts():
    """Packages and top-level modules (``export``, ``spec``, ``reference``, ``_runtime``, ...) depend on each
    other one way too: the exporter's check runs the reference and the reference reads the spec, so the
    spec (``spec/``) imports neither. The shared definitions are left out: every part reads them."""
    def part(name):
        return ".".join(name.split(".")[:2])
    edges = {(part(name), part(target)) for name, targets in _import_graph().items() for target in targets
             if part(name) != part(target) and not {name, target} & SHARED}
    assert not list(nx.simple_cycles(nx.DiGraph(sorted(edges))))


def test_runtime_imports_nothing_public_but_the_shared_definitions():
    """_runtime is below the public modules: it reads errors, messages, protocol, the version and the
    History type, and no public module that could import it back."""
    upward = {f"{name} -> {target}" for name, targets in _import_graph().items() if name.startswith("gradbridge._runtime")
              for target in targets if not target.startswith("gradbridge._runtime") and target not in SHARED}
    assert not upward, upward


# ---- the test suite's own borders ----

def _test_sources():
    tests = Path(__file__).resolve().parent
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(tests.rglob("*.py"))}


def _imports_a_test_file(node) -> bool:
    """``import tests.test_x``, ``from tests.test_x import ...``, ``from .test_x import ...``, ``from . import test_x``."""
    if isinstance(node, ast.Import):
        return any(part.startswith("test_") for a in node.names for part in a.name.split("."))
    if isinstance(node, ast.ImportFrom):
        module = (node.module or "").split(".")
        return (any(part.startswith("test_") for part in module)
                or module in ([""], ["tests"]) and any(a.name.startswith("test_") for a in node.names))
    return False


def test_no_test_file_imports_another_test_file():
    """What several test files share lives in a support module (tests/faults.py, serving.py, kafka_support.py,
    data.py, ...) and fixtures in conftest.py: importing a test file would run its module and hand its fixtures on."""
    found = [f"{path.name}:{node.lineno}" for path, tree in _test_sources().items() for node in ast.walk(tree)
             if _imports_a_test_file(node)]
    assert not found, found


def test_every_service_the_tests_start_is_stopped_by_a_with_block():
    """tests/serving.py's Service is a context manager: each start is the head of a with-block, which kills the
    process however the block ends (a test that kills or restarts one on purpose does so inside it)."""
    loose = []
    for path, tree in _test_sources().items():
        heads = {id(item.context_expr) for node in ast.walk(tree) if isinstance(node, ast.With) for item in node.items}
        loose += [f"{path.name}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Name) and node.func.id == "Service" and id(node) not in heads]
    assert not loose, loose
