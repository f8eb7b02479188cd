"""Shared fixtures: the exported test modules and the one in-process JVM."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO_ROOT = TESTS.parent


def _load_fixture_writer():
    spec = importlib.util.spec_from_file_location("export_java_test_models", TESTS / "fixtures" / "export_java_test_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict:
    """The fixture modules (good and bad) by file name, exported once per session."""
    return {path.name: path for path in _load_fixture_writer().write_fixtures(tmp_path_factory.mktemp("models")).values()}


@pytest.fixture(scope="session")
def model_path(models) -> Path:
    return models["linear_regression.pt"]


@pytest.fixture(scope="session")
def jvm():
    """Starts the JVM in this process, once: JPype cannot restart it."""
    import jpype
    import torch  # noqa: F401  libtorch first, so DJL binds to it

    from gradbridge import jvm as gradbridge_jvm

    assert not jpype.isJVMStarted(), "another fixture started the JVM with other options"
    gradbridge_jvm.start()
    assert jpype.isJVMStarted()
    return gradbridge_jvm
