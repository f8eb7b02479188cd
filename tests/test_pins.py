"""Names and versions defined once per language, tied together here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import jpype
import numpy as np
import torch

from gradbridge import errors, protocol
from gradbridge._runtime import classpath, libtorch, oplist
from tests import spark_cluster

REPO_ROOT = Path(__file__).resolve().parents[1]


_gradle_properties = spark_cluster.gradle_properties


def test_default_venv_holds_the_jars_libtorch_release():
    """.venv holds the range's oldest torch, the libtorch release of the pytorch-native-cpu jar (the Makefile
    installs torch==torchVersion); tests/test_torch_range.py ties the range to it."""
    assert torch.__version__.split("+")[0] == _gradle_properties()["torchVersion"]


def test_pyspark_pin_matches_spark_version():
    """The test cluster (pip's pyspark) runs the Spark the subproject compiles against."""
    test_extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert f"pyspark=={_gradle_properties()['sparkVersion']}" in test_extra


def test_spark_lines_cover_3_5_and_4_x():
    """One artifact per Scala version: gradbridge-spark_2.13 built against Spark 4.0.x, _2.12 against the first
    3.5 release; the real-cluster matrix (--spark-lines) holds the oldest and newest pip pyspark of each line."""
    props = _gradle_properties()
    assert props["sparkVersion"].startswith("4.0.") and props["scalaBinaryVersion"] == "2.13"
    assert props["spark35Version"] == "3.5.0" and props["spark35ScalaBinaryVersion"] == "2.12"
    versions = spark_cluster.cluster_versions()
    lines = {}
    for version in versions:
        lines.setdefault(spark_cluster.scala_of(version), []).append(tuple(map(int, version.split("."))))
    assert set(lines) == {"2.12", "2.13"}, versions
    assert min(lines["2.12"]) == (3, 5, 0) and max(lines["2.12"])[:2] == (3, 5), versions
    assert min(lines["2.13"]) == (4, 0, 0) and max(lines["2.13"])[:2] == (4, 3), versions
    assert spark_cluster.submit_jar_task("2.13") == ":spark:sparkSubmitJar"
    assert spark_cluster.submit_jar_task("2.12") == ":spark:sparkSubmitJar_2_12"


def test_built_classpath_uses_the_pinned_artifacts():
    props = _gradle_properties()
    jars = {Path(entry).name for entry in classpath.resolve().entries}
    # DJL's libtorch distribution only: no DJL code (engine, JNI, API) is on the classpath
    assert not [j for j in jars if j.startswith(("pytorch-engine-", "pytorch-jni-", "api-0.", "jna-"))], jars
    assert f"pytorch-native-cpu-{props['torchVersion']}-{props['pytorchNativeClassifier']}.jar" in jars


def test_java_protocol_constants_match_python(jvm):
    Protocol = jpype.JClass("dev.gradbridge.Protocol")
    assert int(Protocol.VERSION) == protocol.PROTOCOL_VERSION
    assert str(Protocol.METADATA_FILE) == protocol.METADATA_FILE
    assert str(Protocol.METADATA_FORMAT) == protocol.METADATA_FORMAT
    assert [str(m) for m in Protocol.REQUIRED_METHODS] == list(protocol.REQUIRED_METHODS)
    # protocol 2 ("v-next"): what data-parallel training needs, and the versions both languages read
    assert [int(v) for v in Protocol.SUPPORTED_VERSIONS] == list(protocol.SUPPORTED_VERSIONS)
    assert [str(m) for m in Protocol.DATA_PARALLEL_METHODS] == list(protocol.DATA_PARALLEL_METHODS)
    assert str(Protocol.SHARDED_RULE) == protocol.SHARDED_RULE  # a Spark history's "sharded" rule, which the replay takes
    # protocol 3 (format="export"): its version and the metadata key of its program
    assert int(Protocol.EXPORT_VERSION) == protocol.EXPORT_PROTOCOL_VERSION
    assert str(Protocol.PROGRAM_KEY) == protocol.PROGRAM_KEY
    assert int(Protocol.OPLIST_VERSION) == oplist.VERSION
    native = "".join(p.read_text() for p in sorted((Path(__file__).resolve().parents[1] / "native").glob("oplist_*")))
    assert re.search(r"kOpListVersion = (\d+);", native).group(1) == str(oplist.VERSION)
    # protocol 3's rules file (op-list version, limits, allow-list): Java reads the jar's copy; two limits live
    # in code too (gradbridge.json's size, read before the rules apply; the native layer's accumulate bound)
    from gradbridge._runtime import oplist_check

    stream = Protocol.class_.getResourceAsStream("oplist_rules.json")
    try:
        carried = bytes(stream.readAllBytes())
    finally:
        stream.close()
    assert carried == (Path(oplist_check.__file__).with_name("oplist_rules.json")).read_bytes(), "rebuild the jar"
    assert protocol.METADATA_BYTES == oplist_check.LIMITS["json_bytes"]
    assert f"accumulate > {oplist_check.LIMITS['accumulate']}" in native
    java_names = {str(f.getName()) for f in Protocol.class_.getFields()}
    methods = protocol.REQUIRED_METHODS + protocol.DATA_PARALLEL_METHODS
    python_names = {name for name, value in vars(protocol).items()
                    if name.isupper() and isinstance(value, str) and value in methods}
    assert python_names <= java_names, python_names - java_names
    for name in python_names:
        assert str(getattr(Protocol, name)) == getattr(protocol, name), name


def test_the_16_bit_carrier_is_javas(jvm):
    """Data carries a 16-bit input as protocol.CARRIER in both languages (Java: DType.carrier)."""
    DType = jpype.JClass("dev.gradbridge.DType")
    assert {name: str(DType.of(name).carrier().torchName()) for name in protocol.LOW_PRECISION} == {
        name: protocol.CARRIER for name in protocol.LOW_PRECISION}
    assert protocol.INPUT_DTYPES == protocol.DTYPES + protocol.LOW_PRECISION


def test_buffer_dtypes_are_javas_dtypes(jvm):
    """A buffer may have any dtype Java's DType moves, named in its order (the schema's line lists them)."""
    DType = jpype.JClass("dev.gradbridge.DType")
    assert tuple(str(t.torchName()) for t in DType.values()) == protocol.BUFFER_DTYPES
    assert all(hasattr(torch, name) for name in protocol.BUFFER_DTYPES)


def test_native_library_runs_the_torch_python_loaded(jvm):
    Versions = jpype.JClass("dev.gradbridge.Versions")
    assert str(Versions.libtorch()) == torch.__version__.split("+")[0]
    assert str(Versions.libtorch()) in str(Versions.nativeLibrary())


def test_java_reads_the_one_torch_range(jvm):
    """The jar's range (refusing a libtorch folder outside it) is requirements.txt's torch line."""
    Versions = jpype.JClass("dev.gradbridge.Versions")
    assert str(Versions.TORCH_RANGE) == libtorch.supported()
    for version in ("2.6.0", "2.7.0", "2.7.1", "2.10.2", "2.15.0", "2.16.0", "3.0.0"):
        assert bool(Versions.inTorchRange(version)) == libtorch.in_range(version), version


def test_training_modes_match(jvm):
    Mode = jpype.JClass("dev.gradbridge.Trainer$Mode")
    assert tuple(str(m.name()).lower() for m in Mode.values()) == protocol.MODES


def test_shared_wording_matches(jvm):
    """Lines both languages print, built by each side's one definition from the same values."""
    from gradbridge import messages

    Messages = jpype.JClass("dev.gradbridge.internal.Messages")
    Inputs = jpype.JClass("dev.gradbridge.internal.InputMessages")
    Platform = jpype.JClass("dev.gradbridge.internal.PlatformMessages")
    Protocol3 = jpype.JClass("dev.gradbridge.internal.Protocol3Messages")
    Sharded = jpype.JClass("dev.gradbridge.internal.ShardedMessages")
    longs = jpype.JArray(jpype.JLong)
    assert str(Messages.unknownMode("turbo")) == messages.unknown_mode("turbo")
    assert str(Messages.ERROR_PREFIX) == errors.ERROR_PREFIX
    for n, got in ((60, 0), (60, 61), (1, 2**40)):
        assert str(Messages.batchSize(n, got)) == messages.batch_size(n, got)
    for loss in (float("nan"), float("inf"), float("-inf")):
        assert str(Messages.divergence(loss, 3, 1, 8, 15)) == messages.divergence(loss, 3, 1, 8, 15)
    for source in ("data.npz", ""):
        assert str(Messages.tensorSpec(source, "x", "float32", longs([-1, 4]), "float64", longs([60, 5]))) \
            == messages.tensor_spec(source, "x", "float32", [-1, 4], "float64", [60, 5])
    # a model's inputs
    assert str(Inputs.INPUT_SPECS) == messages.INPUT_SPECS
    needs = ["input_ids", "attention_mask", "y"]
    java_list = lambda items: jpype.java.util.ArrayList(jpype.java.util.Arrays.asList(*items))  # noqa: E731
    assert str(Inputs.inputMissing("d.npz", "y", java_list(["x"]), java_list(needs))) \
        == messages.input_missing("d.npz", "y", ["x"], needs)
    # an .npz array the model does not take; an id or label outside what it takes (ValueRanges / data.out_of_range)
    assert str(Inputs.unknownArray("d.npz", "extra", java_list(["left", "right"]))) \
        == messages.unknown_array("d.npz", "extra", ["left", "right"])
    for element, low, high in ((None, 0, 2), ([1], 0, 3), ([0, 2], -100, 5)):
        assert str(Inputs.valueOutOfRange("d.npz", "y", None if element is None else longs(element), 7, low, high)) \
            == messages.value_out_of_range("d.npz", "y", element, 7, low, high)
    # an online input beyond --max-input-abs (Java's double spelling on both sides)
    for value, limit in ((-3e7, 1e6), (float(np.float32(3e38)), 1e6), (2.5, 1.0), (1e-5, 1e-6)):
        assert str(Inputs.inputTooLarge("x", "[1, 2]", value, limit)) == messages.input_too_large("x", [1, 2], value, limit)
    # why an operator library is refused before it is loaded
    assert str(Platform.NOT_ELF) == messages.NOT_ELF
    assert str(Platform.elfClass(32)) == messages.elf_class(32)
    for e_type in (0, 1, 2, 4, 9):
        assert str(Platform.elfType(e_type)) == messages.elf_type(e_type)
    assert str(Platform.elfMachine(183, "x86_64", 62)) == messages.elf_machine(183, "x86_64", 62)
    assert str(Platform.elfTruncated(294968, 98322)) == messages.elf_truncated(294968, 98322)
    assert str(Platform.opLibraryUnloadable("lib.so", "no such file")) == \
        messages.op_library_unloadable("lib.so", "no such file")
    # a protocol-3 file without one of its entries
    assert str(Protocol3.programEntryMissing("m.pt", "state/0.bin")) == messages.program_entry_missing("m.pt", "state/0.bin")
    # ... a state entry of another dtype or shape, a state file of another size, an unreadable file
    assert str(Protocol3.programStateMismatch("m.pt", "param:w", "float32 [3]", "float64 [3]")) == \
        messages.program_state_mismatch("m.pt", "param:w", "float32 [3]", "float64 [3]")
    assert str(Protocol3.programStateBytes("m.pt", "state/0.bin", 4, "param:w", "float32 [3]", 12)) == \
        messages.program_state_bytes("m.pt", "state/0.bin", 4, "param:w", "float32 [3]", 12)
    assert str(Protocol3.programUnreadable("m.pt", "invalid CRC")) == messages.program_unreadable("m.pt", "invalid CRC")
    assert str(Protocol3.programVersion("m.pt", "1", 2)) == messages.program_version("m.pt", "1", 2)
    # the native layer's cache: a damaged library, a folder that cannot be written
    assert str(Platform.CACHE_ENV) == messages.CACHE_ENV
    assert str(Platform.digestMismatch("ab" * 32, "cd" * 32)) == messages.digest_mismatch("ab" * 32, "cd" * 32)
    assert str(Platform.cacheDamaged("libtorch", "/c", "x.so: truncated", "extracting it again")) == \
        messages.cache_damaged("libtorch", "/c", "x.so: truncated", "extracting it again")
    assert str(Platform.cacheUnwritable("/c/native", "Permission denied")) == \
        messages.cache_unwritable("/c/native", "Permission denied")
    assert str(Platform.notAFolder("/c")) == messages.not_a_folder("/c")
    # what data-parallel training refuses (Python's one check: reference.check_data_parallel)
    assert str(Sharded.dataParallelMethods("m.pt", 1, java_list(["gradient_flags"]))) == \
        messages.data_parallel_methods("m.pt", 1, ["gradient_flags"])
    assert str(Sharded.dataParallelBuffers("m.pt", java_list(["bn.running_mean"]))) == \
        messages.data_parallel_buffers("m.pt", ["bn.running_mean"])
    assert str(Sharded.dataParallelAccumulate("m.pt", 4)) == messages.data_parallel_accumulate("m.pt", 4)
    assert jpype.JClass("dev.gradbridge.internal.ModuleAccess").MAX_THREADS == messages.MAX_THREADS


def test_metadata_keys_match_java(jvm):
    """Every key Java's Metadata (and its Checkpoint) reads or writes is a key Python names."""
    Modifier = jpype.JClass("java.lang.reflect.Modifier")

    def snake_fields(class_name):
        fields = jpype.JClass(class_name).class_.getDeclaredFields()
        names = [str(f.getName()) for f in fields
                 if not Modifier.isStatic(f.getModifiers()) and not Modifier.isTransient(f.getModifiers())]
        return tuple(re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", n).lower() for n in names)

    java_keys = snake_fields("dev.gradbridge.Metadata")
    required = len(protocol.METADATA_KEYS)
    assert java_keys[:required] == protocol.METADATA_KEYS
    assert sorted(java_keys[required:]) == sorted(protocol.OPTIONAL_METADATA_KEYS)
    # Python's own keys (``weights``): Java does not read them, it carries them into checkpoints as they are
    assert not set(protocol.PYTHON_METADATA_KEYS) & set(java_keys + protocol.METADATA_KEYS)
    assert snake_fields("dev.gradbridge.Metadata$Checkpoint") == protocol.CHECKPOINT_KEYS


def test_adapter_file_names_are_pefts():
    """`gradbridge state-dict --adapter` writes the files PeftModel.from_pretrained looks for."""
    from peft.utils import CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME

    from gradbridge.export import weights

    assert (weights.ADAPTER_WEIGHTS, weights.ADAPTER_CONFIG) == (SAFETENSORS_WEIGHTS_NAME, CONFIG_NAME)


def test_java_leaves_python_autograd_on(jvm, model_path):
    """Java calls set grad mode for their own duration only: a Java backward works under Python's
    no_grad, and this thread's grad mode stays as it was."""
    module = jvm.load_module(model_path)
    try:
        with torch.no_grad():
            x = jvm.to_tensor(np.ones((4, 1), dtype=np.float32))
            assert float(module.trainStep(x, x)) >= 0.0
            assert not torch.is_grad_enabled()
    finally:
        module.close()
    w = torch.ones(2, requires_grad=True)
    (w * 3).sum().backward()
    assert torch.is_grad_enabled() and w.grad.tolist() == [3.0, 3.0]


def test_feedback_log_format_is_the_same_in_java_and_python():
    import re

    from gradbridge import feedback_log

    java = (Path(__file__).resolve().parent.parent / "java/src/main/java/dev/gradbridge/online/LogFormat.java").read_text()
    constants = dict(re.findall(r"public static final \w+ (\w+) = ([^;]+);", java))
    assert constants["FILE_NAME"] == f'"{feedback_log.FILE_NAME}"' and constants["FORMAT"] == f'"{feedback_log.FORMAT}"'
    assert int(constants["FORMAT_VERSION"]) == feedback_log.FORMAT_VERSION
    assert int(constants["FRAME_HEADER"]) == feedback_log.FRAME_HEADER and constants["MAX_PAYLOAD"] == "64 << 20"
    assert feedback_log.MAX_PAYLOAD == 64 << 20
    for name, kind in feedback_log.RECORD_TYPES.items():
        assert constants[name.upper()] == f"'{kind.decode()}'", name
    assert feedback_log.crc32c(b"123456789") == 0xE3069283  # CRC-32C's check value, as java.util.zip.CRC32C
    # a G record's decisions and the header's gate policies
    record = (Path(__file__).resolve().parent.parent / "java/src/main/java/dev/gradbridge/online/LogRecord.java").read_text()
    decisions = dict(re.findall(r"static final int (PUBLISHED|HELD|ROLLED_BACK) = (\d+);", record))
    assert {name: int(v) for name, v in decisions.items()} == {
        "PUBLISHED": feedback_log.GATE_PUBLISHED, "HELD": feedback_log.GATE_HELD, "ROLLED_BACK": feedback_log.GATE_ROLLED_BACK}
    policies = (Path(__file__).resolve().parent.parent / "java/src/main/java/dev/gradbridge/online/HoldPolicy.java").read_text()
    assert tuple(name.lower() for name in re.findall(r"^    ([A-Z]+)[,;]$", policies, re.MULTILINE)) \
        == feedback_log.HOLD_POLICIES


def test_every_error_type_lives_in_errors_and_is_exported():
    """One home for the exception hierarchy: no error class elsewhere; the package exports each one, and
    the modules that used to define one still name it."""
    import gradbridge
    from gradbridge import errors

    package = REPO_ROOT / "python" / "gradbridge"
    elsewhere = [f"{path.relative_to(package)}: {m.group(0)}" for path in package.rglob("*.py") if path.name != "errors.py"
                 for m in re.finditer(r"^class \w+\((?:\w+, )*\w*(?:Error|Exception)\b", path.read_text(), re.MULTILINE)]
    assert not elsewhere, elsewhere
    defined = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == errors.__name__}
    assert defined <= set(gradbridge.__all__), defined - set(gradbridge.__all__)
    assert all(getattr(gradbridge, name) is getattr(errors, name) for name in defined)
    from gradbridge._runtime import files
    from gradbridge import replay
    from gradbridge.export import ExportError, finetune
    from gradbridge.spec import groups
    assert (ExportError, finetune.FineTuneError, groups.GroupError, replay.LogError, files.WriteError) == (
        errors.ExportError, errors.FineTuneError, errors.GroupError, errors.LogError, errors.WriteError)


def test_the_error_prefixes_are_written_once():
    """`error: ` (Java's programs) and `gradbridge: error: ` (the command) are errors.py's alone."""
    from gradbridge import errors

    package = REPO_ROOT / "python" / "gradbridge"
    written = [str(path.relative_to(package)) for path in package.rglob("*.py")
               if re.search(r"""["'](gradbridge: )?error: """, path.read_text())]
    assert written == ["errors.py"], written
    assert errors.CLI_ERROR_PREFIX == "gradbridge: " + errors.ERROR_PREFIX == "gradbridge: error: "


def test_online_open_learner_defaults_are_the_java_builders(jvm):
    """online.open_learner's defaults are what a fresh OnlineLearnerBuilder holds: read from the
    builder itself, so renaming or moving Java's constants cannot hide a drift."""
    import inspect

    from gradbridge import online

    builder = jpype.JClass("dev.gradbridge.online.OnlineLearner").builder()

    def java_default(field):
        declared = builder.getClass().getDeclaredField(field)
        declared.setAccessible(True)
        return declared.get(builder)

    defaults = {name: p.default for name, p in inspect.signature(online.open_learner).parameters.items()}
    for python, java in (("max_batch", "maxBatch"), ("max_wait_ms", "maxWaitMillis"), ("publish_every", "publishEvery"),
                         ("checkpoint_every", "checkpointEvery"), ("queue_capacity", "queueCapacity"),
                         ("max_grad_norm", "maxGradNorm"), ("gate_max_regression", "gateMaxRegression")):
        assert defaults[python] == java_default(java), python
    assert defaults["fsync"] == str(java_default("fsync").name()).lower()
    assert defaults["gate_on_hold"] == str(java_default("gateOnHold").name()).lower()
    # None: the builder's own default applies (open_learner does not pass it)
    assert defaults["predictors"] is defaults["max_input_abs"] is defaults["keep_versions"] is None


def test_every_java_default_is_protocols_of_the_same_name(jvm):
    """One home per fact: Java keeps its defaults as constants, a run's in Protocol and the online learner's in
    OnlineLearner, and each is protocol.DEFAULT_* of the same name and value (every one of those, the export's
    format aside, is one of Java's). The seed both hold is one value."""
    java = {}
    for class_name in ("dev.gradbridge.Protocol", "dev.gradbridge.online.OnlineLearnerBuilder"):
        cls = jpype.JClass(class_name)
        for field in cls.class_.getFields():
            name = str(field.getName())
            if name.startswith("DEFAULT_"):
                value = getattr(cls, name)  # as Python's type: str, float (double) or int (int, long)
                value = str(value) if isinstance(value, (jpype.JString, str)) else float(value) \
                    if isinstance(value, float) else int(value)
                assert java.setdefault(name, value) == value, f"{name}: Protocol and OnlineLearnerBuilder differ"
    python = {name: value for name, value in vars(protocol).items() if name.startswith("DEFAULT_")}
    assert set(python) - {"DEFAULT_FORMAT"} == set(java), set(python) ^ set(java)
    for name, value in java.items():
        assert python[name] == value and type(python[name]) is type(value), (name, python[name], value)
    # the constants are what runs: the builders start from them (the in-process run's defaults are pinned
    # by test_the_java_trainers_run_defaults_are_pythons and test_online_open_learner_defaults_are_the_java_builders)
    builder = jpype.JClass("dev.gradbridge.Trainer").builder()
    assert int(builder.settings().getEpochs()) == protocol.DEFAULT_EPOCHS
    assert builder.settings().getBatchSize() is None and builder.settings().getSeed() is None  # else the default


def test_java_defaults_have_no_bare_copies():
    """Where Java applies or prints a run's default, it names the constant: no literal 32, "step" or 0 seed left
    in the code that resolves a run's settings or in the commands' option texts."""
    sources = {path: (REPO_ROOT / path).read_text() for path in (
        "java/src/main/java/dev/gradbridge/internal/RunStart.java", "java/src/main/java/dev/gradbridge/Trainer.java",
        "java/src/main/java/dev/gradbridge/RunSettings.java", "programs/src/main/java/dev/gradbridge/cli/RunOptions.java",
        "programs/src/main/java/dev/gradbridge/cli/TrainCommand.java",
        "serve/src/main/java/dev/gradbridge/serve/ServeCommand.java")}
    bare = [f"{path}: {m.group(0)}" for path, text in sources.items() for m in re.finditer(
        r"(getBatchSize\(\), \d+\)|getSeed\(\), \d+L?\)|getMode\(\), \"\w+\"\)|private int epochs = \d+;"
        r"|\(default (\d+|step|continue)\b[^\"]*\"\)|defaultValue = \"\d+\", description = \"epochs)", text)]
    assert not bare, bare


def test_long_exception_texts_are_shortened_by_one_rule():
    """torch's multi-line messages become one line through messages.one_line only."""
    from gradbridge import messages

    package = REPO_ROOT / "python" / "gradbridge"
    written = [str(path.relative_to(package)) for path in package.rglob("*.py")
               if re.search(r"\.join\((str\(ex\)|f\".*\{ex\}\")\.split\(\)\)", path.read_text())]
    assert written == ["messages/runs.py"], written
    assert messages.one_line(RuntimeError("Target 5\n  is out of bounds.\n")) == "Target 5 is out of bounds."
    assert messages.one_line(ValueError()) == "ValueError"


def test_the_batch_size_range_has_one_wording():
    from gradbridge import messages

    package = REPO_ROOT / "python" / "gradbridge"
    written = [str(path.relative_to(package)) for path in package.rglob("*.py") if "batch size must be in" in path.read_text()]
    assert written == ["messages/runs.py"], written
    assert messages.batch_size(60, 0) == "batch size must be in 1..60, got 0"


def test_the_seed_learning_rate_is_the_java_seed_examples_default():
    from gradbridge.models import SEED_LR

    source = (REPO_ROOT / "programs/src/main/java/dev/gradbridge/examples/LinearRegressionTraining.java").read_text()
    default = re.search(r'names = "--lr", defaultValue = "([^"]+)"', source)
    assert default and float(default.group(1)) == SEED_LR, default


def test_the_java_trainers_run_defaults_are_pythons(jvm, models, tmp_path):
    """java.train and reference.train given no batch size, seed or mode run the same epochs, and the
    Java checkpoint records protocol.DEFAULT_BATCH_SIZE, DEFAULT_SEED and DEFAULT_MODE."""
    from gradbridge import java, reference
    from gradbridge.parity import compare_histories

    rng = np.random.default_rng(5)
    x = rng.normal(size=(100, 4)).astype(np.float32)  # 100 samples: another batch size or seed shows
    y = (x @ np.array([[0.5], [1.0], [-1.0], [0.2]])).astype(np.float32)
    model = models["mlp_regressor.pt"]
    checkpoint = tmp_path / "run.pt"
    java_history = java.train(model, x, y, epochs=2, checkpoint=checkpoint)
    report = compare_histories(reference.train(model, x, y, epochs=2), java_history, labels=("python", "java"))
    assert report.within_tolerance, report.table()
    saved = protocol.read_metadata(checkpoint)[protocol.CHECKPOINT_KEY]
    assert (saved["batch_size"], saved["seed"], saved["mode"]) == (
        protocol.DEFAULT_BATCH_SIZE, protocol.DEFAULT_SEED, protocol.DEFAULT_MODE)


def test_torch_versions_lose_their_local_suffix_in_one_place():
    package = REPO_ROOT / "python" / "gradbridge"
    stripping = [str(path.relative_to(package)) for path in package.rglob("*.py") if 'split("+")' in path.read_text()]
    assert stripping == ["_runtime/libtorch.py"], stripping
