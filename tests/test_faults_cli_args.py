"""Fault suite, surface "CLI arguments": `gradbridge export` / `gradbridge parity` print one line,
never a traceback, for bad factories, bad labels and bad tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradbridge import messages
from tests.faults import gradbridge_cli, one_error_line

PREFIX = "gradbridge: error: "


@pytest.fixture
def factories(tmp_path):
    (tmp_path / "badfactories.py").write_text(
        "import torch\n"
        "def raises():\n    raise RuntimeError('no weights here')\n"
        "def not_a_module():\n    return 42\n"
        "def fine():\n    return torch.nn.Linear(4, 3)\n"
        "def normed():\n    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))\n")
    return tmp_path


def test_factory_that_raises(factories):
    result = gradbridge_cli("export", "badfactories:raises", "-o", factories / "m.pt", cwd=factories)
    assert one_error_line(result, PREFIX) == "model 'badfactories:raises': the factory raised RuntimeError: no weights here"
    assert not (factories / "m.pt").exists()


def test_factory_that_returns_no_module(factories):
    result = gradbridge_cli("export", "badfactories:not_a_module", "-o", factories / "m.pt", cwd=factories)
    assert one_error_line(result, PREFIX) == ("model 'badfactories:not_a_module': the factory must return a "
                                              "torch.nn.Module, got int")


def test_an_unknown_format_is_refused(factories):
    result = gradbridge_cli("export", "badfactories:fine", "-o", factories / "m.pt", "--format", "onnx", cwd=factories)
    assert one_error_line(result, PREFIX) == ("argument --format: invalid choice: 'onnx' (choose from 'auto', "
                                              "'torchscript', 'export') (see gradbridge export --help)")
    assert not (factories / "m.pt").exists()


def test_an_option_protocol_3_does_not_hold_is_refused_with_format_export(factories):
    result = gradbridge_cli("export", "badfactories:fine", "-o", factories / "m.pt", "--input-shape", "4", "--loss",
                            "cross_entropy", "--format", "export", "--optimizer", "rmsprop", "--scheduler",
                            "onecycle:max_lr=0.1,total_steps=10,base_momentum=0.0", cwd=factories)
    assert one_error_line(result, PREFIX) == messages.aten_option_refused(
        "OneCycleLR cycling RMSprop's momentum through 0.0 (base_momentum and max_momentum above 0 are held)")
    assert not (factories / "m.pt").exists()


def test_micro_batches_below_protocol_3s_smallest_are_refused(factories):
    """BatchNorm in training cannot run one sample (eager neither): no micro-batches of one."""
    result = gradbridge_cli("export", "badfactories:normed", "-o", factories / "m.pt", "--input-shape", "4", "--loss",
                            "cross_entropy", "--format", "export", "--accumulate", "2", cwd=factories)
    line = one_error_line(result, PREFIX)
    assert line.startswith("format='export': accumulate=2 splits a batch of 2 into micro-batches of [1, 1]"), line
    assert not (factories / "m.pt").exists()


def test_parity_with_labels_outside_the_classes(factories):
    model = factories / "m.pt"
    exported = gradbridge_cli("export", "badfactories:fine", "-o", model, "--input-shape", "4", "--loss",
                              "cross_entropy", cwd=factories)
    assert exported.returncode == 0, exported.stderr
    x = np.zeros((10, 4), np.float32)
    y = np.full(10, 7, np.int64)  # 3 classes
    np.savez(factories / "d.npz", x=x, y=y)
    result = gradbridge_cli("parity", model, "--data", factories / "d.npz", "--epochs", 1, "--batch-size", 5)
    # the data file and the array, the value and the classes (libtorch's "Target 7 is out of bounds" names none)
    assert one_error_line(result, PREFIX) == messages.value_out_of_range(str(factories / "d.npz"), "y", None, 7, 0, 2)


@pytest.mark.parametrize("option, value", [("--rtol", "-1"), ("--atol", "nan"), ("--rtol", "inf")])
def test_negative_or_non_finite_tolerance_is_refused(model_path, tmp_path, option, value):
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 1), np.float32), y=np.zeros((4, 1), np.float32))
    result = gradbridge_cli("parity", model_path, "--data", tmp_path / "d.npz", option, value)
    assert one_error_line(result, PREFIX) == (f"argument {option}: invalid tolerance (a finite number >= 0) value: "
                                              f"'{value}' (see gradbridge parity --help)")


def test_paritycheck_run_refuses_a_negative_tolerance(model_path, tmp_path):
    from gradbridge.commands import parity as paritycheck

    with pytest.raises(ValueError, match=r"^rtol must be a finite number >= 0, got -1"):
        paritycheck.run(model_path, tmp_path / "unused.npz", rtol=-1)


# ---- one line naming the user's path and option (export, state-dict, build-op, parity) ----

import torch  # noqa: E402

from gradbridge.commands import main as cli  # noqa: E402
from gradbridge.errors import CLI_ERROR_PREFIX  # noqa: E402


def _line(capsys, argv):
    """In-process ``gradbridge ARGV``: exit code 1 and the one error line."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as ex:  # argparse's own errors
        code = ex.code
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith(CLI_ERROR_PREFIX), (code, err)
    return err[len(CLI_ERROR_PREFIX):].strip()


MLP = ["export", "mlp", "--input-shape", "4", "--loss", "cross_entropy", "--lr", "0.1"]


@pytest.mark.parametrize("flags, message", [
    (["--scheduler", "cosine"], "scheduler cosine: T_max is required (e.g. cosine:T_max=...)"),
    (["--scheduler", "onecycle:max_lr=0.1"], "scheduler onecycle: total_steps is required (e.g. onecycle:total_steps=...)"),
    (["--scheduler", "cosine:T_max=abc"], "scheduler cosine: T_max must be an integer, got 'abc'"),
    (["--scheduler", "cosine:T_max=1e3"], "scheduler cosine: T_max must be an integer, got 1000.0"),
    (["--scheduler", "onecycle:max_lr=abc,total_steps=5"],
     "scheduler onecycle: max_lr must be a number or one per parameter group (1), got 'abc'"),
    (["--group", "0.:lr=abc"], "parameter group 0 (prefix '0.'): lr must be a number, got 'abc'"),
    (["--group", "0.:lr=0.2", "--group", "0.w:lr=0.3"],
     "parameter groups 0 (prefix '0.') and 1 (prefix '0.w') overlap: 0.weight is in both; give each parameter one "
     "group"),
    (["--milestones", "5"], "--milestones needs --scheduler (two or more, for a SequentialLR)"),
    (["--scheduler", "linear", "--scheduler", "step:step_size=2", "--milestones", "abc"],
     "argument --milestones: invalid milestones (comma-separated integers) value: 'abc' (see gradbridge export --help)"),
    (["--scheduler-interval", "epoch"], "--scheduler-interval needs --scheduler"),
    (["--clip-norm-type", "inf"], "--clip-norm-type needs --clip-norm"),
    (["--class-weights", "1,abc"], "argument --class-weights: invalid list (comma-separated numbers) value: '1,abc' "
                                   "(see gradbridge export --help)"),
    (["--target-shape", "x"], "argument --target-shape: invalid shape (comma-separated positive integers) value: 'x' "
                              "(see gradbridge export --help)"),
])
def test_bad_export_options_name_the_option(tmp_path, capsys, flags, message):
    assert _line(capsys, MLP + flags + ["-o", tmp_path / "m.pt"]) == message
    assert list(tmp_path.iterdir()) == []


def test_builtin_models_take_their_size_from_the_input_shape(tmp_path, capsys):
    from gradbridge import protocol

    assert cli.main(["export", "mlp", "--input-shape", "8", "--loss", "cross_entropy", "-o", str(tmp_path / "m.pt")]) == 0
    parameters = {p["name"]: p["shape"] for p in protocol.read_metadata(tmp_path / "m.pt")["parameters"]}
    assert parameters["0.weight"] == [16, 8]
    assert cli.main(["export", "linear", "--input-shape", "5", "--target-shape", "2", "-o", str(tmp_path / "l.pt")]) == 0
    assert [p["shape"] for p in protocol.read_metadata(tmp_path / "l.pt")["parameters"]] == [[2, 5], [2]]
    capsys.readouterr()
    assert _line(capsys, ["export", "mlp", "--input-shape", "1,8,8", "-o", tmp_path / "x.pt"]) == \
        "model mlp takes --input-shape FEATURES (one number), got 1,8,8"
    assert _line(capsys, ["export", "mlp", "--input-shape", "0", "-o", tmp_path / "x.pt"]) == \
        "argument --input-shape: invalid shape (comma-separated positive integers) value: '0' (see gradbridge export --help)"
    assert not (tmp_path / "x.pt").exists()


@pytest.fixture
def not_modules(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model\n")
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights.pt")
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(tmp_path / "plain.pt"))
    (tmp_path / "folder.pt").mkdir()
    return tmp_path


@pytest.mark.parametrize("name, message", [
    ("notes.txt", "not a TorchScript archive (not a zip file)"),
    ("weights.pt", "a torch.save file, not a TorchScript archive; export the model with `gradbridge export`"),
    ("plain.pt", "TorchScript archive without gradbridge.json; export it with `gradbridge export`"),
    ("folder.pt", "is a directory, not a training module (.pt)"),
])
def test_state_dict_of_something_else_says_what_it_is(not_modules, capsys, name, message):
    assert _line(capsys, ["state-dict", not_modules / name, "-o", not_modules / "out.pt"]) == \
        f"{not_modules / name}: {message}"
    assert not (not_modules / "out.pt").exists()


def test_unwritable_outputs_are_named_by_the_users_path(model_path, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "out.pt"
    expected = f"{target}: cannot write it: {blocker} is not a directory"
    assert _line(capsys, ["state-dict", model_path, "-o", target]) == expected
    assert _line(capsys, MLP + ["-o", target]) == expected
    assert _line(capsys, ["export", "mlp", "--input-shape", "4", "--loss", "cross_entropy", "-o", tmp_path]) == \
        f"{tmp_path}: cannot write it: Is a directory"
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 1), np.float32), y=np.zeros((4, 1), np.float32))
    for flag in ("--report", "--plot"):
        assert _line(capsys, ["parity", model_path, "--data", tmp_path / "d.npz", flag, target]) == expected
    assert _line(capsys, ["build-op", tmp_path / "d.npz", "-o", target]) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "d.npz"]


def test_state_dict_refusals_are_one_line_and_write_nothing(model_path, tmp_path, capsys):
    # an adapter of a model without PEFT; a suffix that names no format; no output at all
    assert _line(capsys, ["state-dict", model_path, "--adapter", tmp_path / "lora"]) == \
        messages.weights_no_adapter(str(model_path))
    assert _line(capsys, ["state-dict", model_path, "-o", tmp_path / "w.npz"]) == messages.weights_suffix(
        str(tmp_path / "w.npz"), ".npz", ".safetensors (safetensors) or .pt, .pth, .bin (torch)")
    assert _line(capsys, ["state-dict", model_path]) == messages.weights_nothing_asked()
    # an adapter folder that is a file, named by the user's path
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert _line(capsys, ["state-dict", model_path, "--adapter", blocker]) == \
        f"{blocker / 'adapter_config.json'}: cannot write it: {blocker} is not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    # --format writes any name
    assert cli.main(["state-dict", str(model_path), "-o", str(tmp_path / "w.npz"), "--format", "safetensors"]) == 0
    assert (tmp_path / "w.npz").read_bytes()[8:9] == b"{"  # safetensors: a header length, then its JSON


def test_build_op_shows_the_compilers_first_error(tmp_path):
    source = tmp_path / "bad.cpp"
    source.write_text("int f() { return undefined_thing; }\nint g() { return other_undefined; }\n")
    result = gradbridge_cli("build-op", source, "-o", tmp_path / "libbad.so")
    line = one_error_line(result, PREFIX)
    assert line.startswith(f"cannot build {source}: ") and "undefined_thing" in line and "error" in line, line
    assert "ninja" not in line and "other_undefined" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.cpp"]


@pytest.mark.parametrize("value", ["0", "x"])
def test_online_bench_refuses_a_bad_feeder_count(capsys, value):
    assert _line(capsys, ["online-bench", "--feeders", value]) == (
        f"argument --feeders: invalid threads (an integer from 1 to 1024) value: '{value}' "
        "(see gradbridge online-bench --help)")


def test_a_model_without_parameters_is_told_so(factories):
    (factories / "noparams.py").write_text(
        "import torch\n"
        "class Scale(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.register_buffer('k', torch.ones(1))\n"
        "    def forward(self, x):\n        return x * self.k\n"
        "def relu():\n    return torch.nn.ReLU()\n"
        "def scale():\n    return Scale()\n")
    for factory, name in (("relu", "ReLU"), ("scale", "Scale")):
        result = gradbridge_cli("export", f"noparams:{factory}", "-o", factories / "m.pt", "--input-shape", "3",
                                cwd=factories)
        assert one_error_line(result, PREFIX) == (f"{name} has no parameters: nothing to train; export a model with "
                                                  "at least one parameter")
        assert not (factories / "m.pt").exists()


def test_parity_with_a_factory_whose_parameter_has_another_shape_names_both_shapes(factories):
    (factories / "shapes.py").write_text(
        "import torch\n"
        "class Dot(torch.nn.Module):\n"
        "    def __init__(self, shape):\n        super().__init__()\n        self.w = torch.nn.Parameter(torch.ones(shape))\n"
        "    def forward(self, x):\n        return (x * self.w).sum(-1, keepdim=True)\n"
        "def flat():\n    return Dot([2])\n"
        "def row():\n    return Dot([1, 2])\n")
    model = factories / "flat.pt"
    exported = gradbridge_cli("export", "shapes:flat", "-o", model, "--input-shape", "2", cwd=factories)
    assert exported.returncode == 0, exported.stderr
    np.savez(factories / "d.npz", x=np.ones((8, 2), np.float32), y=np.ones((8, 1), np.float32))
    result = gradbridge_cli("parity", model, "--data", factories / "d.npz", "--epochs", 1, "--batch-size", 4,
                            "--model-factory", "shapes:row", cwd=factories)
    assert one_error_line(result, PREFIX) == (f"{model} holds w of shape [2], the given model's w has shape [1, 2]: "
                                              "is it this model's export?")


@pytest.mark.parametrize("options, reason", [
    ("-Xmx1k", "Error occurred during initialization of VM; Too small maximum heap"),
    ("-Xbogus", "Unrecognized option: -Xbogus"),
    ("-Xmx64m -Xss1k", "The Java thread stack size specified is too small. Specify at least "),
])
def test_jvm_options_the_jvm_refuses_are_one_line_naming_gradbridge_jvm_options(model_path, tmp_path, options,
                                                                                 reason):
    # Given options with which a JVM in this process would end it with the JVM's own lines
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 1), np.float32), y=np.zeros((4, 1), np.float32))
    result = gradbridge_cli("parity", model_path, "--data", tmp_path / "d.npz", "--epochs", 1, "--batch-size", 2,
                            "--report", tmp_path / "r.json", env={"GRADBRIDGE_JVM_OPTIONS": options})
    # Then gradbridge's line is the only one: the JVM's reason inside it, nothing printed before it
    line = one_error_line(result, PREFIX)
    assert line.startswith(f"a JVM does not start with GRADBRIDGE_JVM_OPTIONS={options}: {reason}"), line
    assert line.endswith("; correct or unset GRADBRIDGE_JVM_OPTIONS"), line
    assert result.stderr.strip().splitlines() == [PREFIX + line]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz"]


def test_replay_from_kafka_without_its_options_is_one_line(tmp_path):
    """Checked before the log is read: --from-kafka needs the topic's address, and the Kafka options need it."""
    result = gradbridge_cli("replay", "--log", tmp_path / "log", "--model", tmp_path / "m.pt", "--from-kafka",
                            "--kafka-topic", "feedback")
    assert one_error_line(result, PREFIX) == ("replay --from-kafka needs --kafka-bootstrap and --kafka-topic (as "
                                              "gradbridge serve took them)")
    result = gradbridge_cli("replay", "--log", tmp_path / "log", "--model", tmp_path / "m.pt", "--kafka-topic", "feedback")
    assert one_error_line(result, PREFIX) == ("--kafka-bootstrap, --kafka-topic and --kafka-properties go with replay "
                                              "--from-kafka")
