"""A model with a custom C++ operator, trained from Java, and `gradbridge gradcheck`.

The operator library is built once per session with docs/custom-ops.md's command (`gradbridge build-op`),
against this Python's libtorch. It then serves the in-process JVM (the same libtorch) and a
separate JVM on the pytorch-native-cpu jar's libtorch (2.7.1): both are 2.7.1 builds with
the C++11 ABI, and the library binds to whichever libtorch is already loaded, by soname.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradbridge import GradbridgeError, java, messages, protocol
from gradbridge._runtime import launcher, ops
from gradbridge._runtime.devtree import root

EXAMPLE = root() / "examples" / "custom-op"


def _gradbridge(*args, cwd):
    return subprocess.run([sys.executable, "-m", "gradbridge", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


@pytest.fixture(scope="session")
def op_library(tmp_path_factory):
    out = tmp_path_factory.mktemp("ops") / "libgbops.so"
    result = _gradbridge("build-op", EXAMPLE / "scaled_tanh.cpp", "-o", out, cwd=out.parent)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:4] == b"\x7fELF"
    return out


@pytest.fixture(scope="session")
def op_models(op_library, tmp_path_factory):
    """The example's right and wrong-backward models exported with `gradbridge export`, and data."""
    out = tmp_path_factory.mktemp("op-models")
    for factory in ("tanh_regressor", "bad_grad_tanh_regressor"):
        result = _gradbridge("export", f"model:{factory}", "-o", out / f"{factory}.pt", "--input-shape", 3,
                             "--optimizer", "adam", "--lr", 0.01, "--op-library", op_library, cwd=EXAMPLE)
        assert result.returncode == 0, result.stderr
    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    np.savez(out / "train.npz", x=x, y=(x @ np.array([[1.0], [-2.0], [0.5]])).astype(np.float32))
    return out


def test_export_records_the_operators_the_module_calls(op_models, models):
    assert protocol.read_metadata(op_models / "tanh_regressor.pt")["custom_ops"] == ["gbops::scaled_tanh"]
    assert protocol.read_metadata(op_models / "bad_grad_tanh_regressor.pt")["custom_ops"] == [
        "gbops::scaled_tanh_bad_grad"]
    assert protocol.read_metadata(models["mlp_classifier.pt"])["custom_ops"] == []


def test_parity_with_the_operator_in_process_and_in_a_separate_jvm(op_models, op_library, jvm):
    result = _gradbridge("parity", "tanh_regressor.pt", "--data", "train.npz", "--epochs", 3, "--batch-size", 16,
                         "--java", "both", "--op-library", op_library, "--report", "r.json", cwd=op_models)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "java: bitwise identical over 3 epochs" in result.stdout
    # The pytorch-native-cpu jar's libtorch in the separate JVM: measured bitwise here; the allowed bound is
    # parity.SEPARATE_JVM_RTOL/ATOL, as for every separate-JVM comparison.
    assert re.search(r"java-subprocess: (bitwise identical|within tolerance) over 3 epochs", result.stdout)
    report = json.loads((op_models / "r.json").read_text())
    assert report["config"]["op_libraries"] == [str(op_library)]


def test_in_process_api_loads_the_library(op_models, op_library, jvm):
    from gradbridge import compare_histories, reference

    x, y = np.load(op_models / "train.npz")["x"], np.load(op_models / "train.npz")["y"]
    settings = dict(epochs=2, batch_size=8, seed=3, mode="fused")
    in_java = java.train(op_models / "tanh_regressor.pt", x, y, op_libraries=[op_library], **settings)
    assert compare_histories(reference.train(op_models / "tanh_regressor.pt", x, y, **settings), in_java).bitwise


def test_missing_library_names_the_operator_and_the_option(op_models):
    model = op_models / "tanh_regressor.pt"
    expected_java = messages.missing_custom_op(str(model), "gbops::scaled_tanh")
    # A process of its own: once loaded, a library stays loaded in this one.
    probe = ("import sys\nfrom gradbridge import ModuleLoadError, jvm\n"
             "try:\n    jvm.load_module(sys.argv[1])\nexcept ModuleLoadError as ex:\n    print(ex)\n")
    in_process = subprocess.run([sys.executable, "-c", probe, str(model)], capture_output=True, text=True)
    assert in_process.stdout.startswith(expected_java), in_process.stdout + in_process.stderr
    with pytest.raises(GradbridgeError) as separate:
        launcher.train(model, op_models / "train.npz", epochs=1, history=op_models / "h.jsonl")
    assert str(separate.value).endswith(expected_java)
    assert not (op_models / "h.jsonl").exists()


@pytest.mark.parametrize("library, reason", [("absent.so", "no such file"), ("train.npz", messages.NOT_ELF)])
def test_bad_op_library_is_one_line_in_both_languages(op_models, library, reason):
    expected = messages.op_library_unloadable(library, reason)
    result = _gradbridge("parity", "tanh_regressor.pt", "--data", "train.npz", "--op-library", library, cwd=op_models)
    assert result.returncode == 1 and result.stderr.strip() == f"gradbridge: error: {expected}", result.stderr
    run = subprocess.run(launcher.command(launcher.TRAIN_MAIN, ["--model", "tanh_regressor.pt", "--data", "train.npz",
                                                                 "--op-library", library]),
                         capture_output=True, text=True, cwd=op_models)
    assert run.returncode == 1 and run.stderr.strip().splitlines() == [f"error: {expected}"], run.stderr
    seed = subprocess.run(launcher.command(launcher.SEED_MAIN, ["--model", "tanh_regressor.pt", "--op-library",
                                                                library]),
                          capture_output=True, text=True, cwd=op_models)
    assert seed.returncode == 1 and seed.stderr.strip().splitlines()[-1] == f"error: {expected}", seed.stderr


def test_gradcheck_passes_a_right_backward(op_models, op_library, jvm):
    result = _gradbridge("gradcheck", "tanh_regressor.pt", "--data", "train.npz", "--op-library", op_library,
                         "--report", "gc.json", cwd=op_models)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Java vs Python autograd (float32, same module): bitwise identical for 4 parameters" in result.stdout
    assert "verdict: gradients check out" in result.stdout
    report = json.loads((op_models / "gc.json").read_text())
    assert report["ok"] and all(p["max_abs_error"] < 1e-8 for p in report["finite_differences"])


def test_gradcheck_catches_a_wrong_backward_and_names_the_parameter(op_models, op_library, jvm):
    result = _gradbridge("gradcheck", "bad_grad_tanh_regressor.pt", "--data", "train.npz", "--op-library",
                         op_library, "--report", "gc-bad.json", cwd=op_models)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"verdict: WRONG GRADIENTS: hidden\.weight element \d+: analytic [-\d.e]+, numeric", result.stdout)
    wrong = {p["name"] for p in json.loads((op_models / "gc-bad.json").read_text())["finite_differences"]
             if not p["ok"]}
    # Only the parameters upstream of the wrong backward are wrong: its alpha factor is missing.
    assert wrong == {"hidden.weight", "hidden.bias"}
    report = json.loads((op_models / "gc-bad.json").read_text())
    ratios = [p["numeric"] / p["analytic"] for p in report["finite_differences"] if not p["ok"]]
    assert np.allclose(ratios, 2.0, rtol=1e-6)  # alpha = 2


def test_gradcheck_on_a_model_without_custom_operators(models, tmp_path, jvm):
    x = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(16, dtype=np.int64) % 3)
    result = _gradbridge("gradcheck", models["mlp_classifier.pt"], "--data", tmp_path / "d.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verdict: gradients check out" in result.stdout


def test_docs_custom_op_block_runs(tmp_path):
    guide = (root() / "docs" / "custom-ops.md").read_text()
    block = re.search(r"```bash\n(.*?)```", guide[guide.index("<!-- custom-op -->"):], re.DOTALL).group(1)
    shutil.copytree(EXAMPLE, tmp_path / "examples" / "custom-op")
    # `gradbridge` is the script beside this interpreter (the README's set-up puts both in .venv/bin).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "java: bitwise identical" in result.stdout and "verdict: gradients check out" in result.stdout
    assert (tmp_path / "examples" / "custom-op" / "gradcheck.json").is_file()


def _bad_libraries(op_library, folder):
    """A truncated copy of the real library, and ELF files of the wrong class, type and machine."""
    good = op_library.read_bytes()
    (folder / "truncated.so").write_bytes(good[:len(good) // 3])
    (folder / "header-only.so").write_bytes(good[:64])

    def patched(name, offset, value):
        data = bytearray(good)
        data[offset:offset + len(value)] = value
        (folder / name).write_bytes(bytes(data))

    patched("object.so", 16, (1).to_bytes(2, "little"))  # ET_REL
    patched("arm.so", 18, (183).to_bytes(2, "little"))  # EM_AARCH64 on x86_64 (EM_X86_64 elsewhere)
    if platform.machine() == "aarch64":
        patched("arm.so", 18, (62).to_bytes(2, "little"))
    patched("elf32.so", 4, b"\x01")
    return ["truncated.so", "header-only.so", "object.so", "arm.so", "elf32.so"]


def test_a_truncated_or_foreign_library_is_identified_before_it_is_loaded(op_models, op_library, tmp_path):
    # Given libraries that the dynamic linker would refuse, or map past the file's end (SIGBUS)
    names = _bad_libraries(op_library, tmp_path)
    reasons = {name: ops.library_problem(tmp_path / name) for name in names}
    assert reasons["truncated.so"].startswith("truncated: its headers need ")
    assert reasons["object.so"] == messages.elf_type(1) == "a relocatable object (.o), not a shared library"
    assert reasons["elf32.so"] == messages.elf_class(32)
    assert reasons["arm.so"].startswith("built for ELF machine ")
    assert ops.library_problem(op_library) is None
    for name in names:
        expected = messages.op_library_unloadable(str(tmp_path / name), reasons[name])
        # When each entry point that loads libraries is given the truncated one, and the Python
        # and the Java check (export, gradbridge-train) each of the others
        entries = {
            "export": lambda: _gradbridge("export", "model:tanh_regressor", "-o", tmp_path / "m.pt", "--input-shape", 3,
                                          "--op-library", tmp_path / name, cwd=EXAMPLE),
            "parity": lambda: _gradbridge("parity", "tanh_regressor.pt", "--data", "train.npz", "--op-library",
                                          tmp_path / name, cwd=op_models),
            "gradcheck": lambda: _gradbridge("gradcheck", "tanh_regressor.pt", "--data", "train.npz", "--op-library",
                                             tmp_path / name, cwd=op_models),
            "gradbridge-train": lambda: subprocess.run(launcher.command(launcher.TRAIN_MAIN, [
                "--model", "tanh_regressor.pt", "--data", "train.npz", "--op-library", str(tmp_path / name),
                "--history", str(tmp_path / "h.jsonl")]), capture_output=True, text=True, cwd=op_models),
            "in-process JVM": lambda: subprocess.run([sys.executable, "-c", (
                "import sys\nfrom gradbridge import ModuleLoadError, jvm\n"
                "try:\n    jvm.load_module(sys.argv[1], op_libraries=[sys.argv[2]])\n"
                "except ModuleLoadError as ex:\n    print('error:', ex, file=sys.stderr); sys.exit(1)\n"),
                "tanh_regressor.pt", str(tmp_path / name)], capture_output=True, text=True, cwd=op_models),
        }
        chosen = entries if name == "truncated.so" else ("export", "gradbridge-train")
        runs = {entry: entries[entry]() for entry in chosen}
        # Then each says why in one line, exit 1, and no process died of the file
        for entry, run in runs.items():
            lines = run.stderr.strip().splitlines()
            # (the in-process JVM's exception adds the Java class name after the line)
            assert run.returncode == 1 and f"error: {expected}" in lines[-1], (name, entry, run.stderr)
            assert "SIGBUS" not in run.stderr and len([l for l in lines if "error" in l]) == 1, (name, entry)
        assert not (tmp_path / "m.pt").exists() and not (tmp_path / "h.jsonl").exists()
        assert not list(op_models.glob("hs_err_pid*.log")) and not list(EXAMPLE.glob("hs_err_pid*.log"))
