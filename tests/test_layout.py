"""The package's borders: the public modules users import (README, docs, examples) stay where they are;
runtime plumbing lives in gradbridge._runtime."""

import subprocess
import sys

import pytest

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
