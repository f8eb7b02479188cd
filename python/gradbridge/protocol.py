"""The training-module protocol: method names and the ``gradbridge.json`` metadata schema.

This module is the one source of truth for both languages. The Java side keeps the same
names in ``dev.gradbridge.Protocol``; ``tests/test_pins.py`` reads that class through
JPype and fails when the two drift apart.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import messages
from .errors import DTypeError, ProtocolError

#: The version new exports write. Version 2 ("v-next") adds ``DATA_PARALLEL_METHODS``; nothing was
#: removed or changed, so modules of every version in ``SUPPORTED_VERSIONS`` load and train.
PROTOCOL_VERSION = 2
#: Protocol 3: a training step captured with torch.export as gradbridge's own op lists (``oplist``), run
#: op by op by the native layer (``export_training_module(..., format="export")``; docs/protocol3.md).
#: The same methods, another file: a zip of ``gradbridge.json`` (with ``PROGRAM_KEY``), op lists and state.
EXPORT_PROTOCOL_VERSION = 3
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2, 3)
#: The export formats: TorchScript (protocols 1 and 2), torch.export (protocol 3), or auto: TorchScript where
#: it captures the model and passes the export's check, protocol 3 otherwise (``export_training_module``).
FORMATS = ("auto", "torchscript", "export")
DEFAULT_FORMAT = "auto"
#: ``capture`` metadata key of a module ``format="auto"`` exported with protocol 3: why not TorchScript
AUTO_REASON_KEY = "auto"
METADATA_FILE = "gradbridge.json"
#: The most bytes gradbridge.json may inflate to (protocol 3's JSON limit, _runtime/oplist_rules.json)
METADATA_BYTES = 268435456
METADATA_FORMAT = "gradbridge.training-module"

# How a Trainer walks an epoch (Java: dev.gradbridge.Trainer.Mode; tests/test_pins.py pins the two):
# full = one step on all data, step = one train_step call per batch, fused = one train_epoch call.
MODES = ("full", "step", "fused")
# Java's defaults, one home per fact: each DEFAULT_* below is the Java constant of the same name, in
# dev.gradbridge.Protocol (a run's) or dev.gradbridge.online.OnlineLearner (the online learner's);
# tests/test_pins.py pins every one to its Java twin. Docs that repeat one are checked by tests/test_docs.py.
# A run's, where neither the caller nor a resumed checkpoint gives one (Trainer, SparkTrainer, their commands,
# reference.train, gradbridge parity): epochs (Java's builders and commands), batch size, seed, mode.
DEFAULT_EPOCHS = 1
DEFAULT_BATCH_SIZE = 32
DEFAULT_SEED = 0
DEFAULT_MODE = "step"
# The online learner's (OnlineLearner.Builder, gradbridge serve, online.open_learner); its seed is DEFAULT_SEED.
DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_WAIT_MILLIS = 10
DEFAULT_PUBLISH_EVERY = 1
DEFAULT_CHECKPOINT_EVERY = 100
DEFAULT_QUEUE_CAPACITY = 10_000
#: predictor copies, at most the machine's cores (OnlineLearner.defaultPredictors)
DEFAULT_PREDICTORS = 2
DEFAULT_FSYNC = "always"
DEFAULT_GROUP_COMMIT_MILLIS = 2
#: 0: no gradient-norm limit
DEFAULT_MAX_GRAD_NORM = 0.0
#: the largest magnitude of a floating-point input (0: no limit)
DEFAULT_MAX_INPUT_ABS = 1e6
DEFAULT_KEEP_VERSIONS = 8
DEFAULT_GATE_MAX_REGRESSION = 0.0
DEFAULT_GATE_ON_HOLD = "continue"

# Method names, as scripted on every exported training module.
FORWARD = "forward"
CALCULATE_LOSS_AND_BACKWARD = "calculate_loss_and_backward"
ZERO_GRAD = "zero_grad"
SGD_STEP = "sgd_step"
GET_PARAMETERS = "get_parameters"
PARAMETER_NAMES = "parameter_names"
GET_GRADIENTS = "get_gradients"
OPTIMIZER_STEP = "optimizer_step"
TRAIN_STEP = "train_step"
TRAIN_EPOCH = "train_epoch"
EVALUATE = "evaluate"
SET_PARAMETERS = "set_parameters"
BUFFER_NAMES = "buffer_names"
GET_BUFFERS = "get_buffers"
GET_STATE = "get_state"
SET_STATE = "set_state"
GET_LR = "get_lr"
SET_LR = "set_lr"
OPTIMIZER_STATE = "optimizer_state"
LOAD_OPTIMIZER_STATE = "load_optimizer_state"
# Fine-tuning methods (parameter groups, schedules); modules exported before them lack them.
GET_LRS = "get_lrs"
SET_GROUP_LR = "set_group_lr"
SCHEDULE_EPOCH = "schedule_epoch"
# Data-parallel methods (protocol 2): a worker computes gradients without stepping
# (zero_grad, calculate_loss_and_backward, get_gradients, gradient_flags); the driver writes the
# combined gradients (set_gradients) and steps (optimizer_step).
GRADIENT_FLAGS = "gradient_flags"
SET_GRADIENTS = "set_gradients"

#: Methods that every protocol-v1 module has; a loader rejects a module that lacks one.
REQUIRED_METHODS: tuple[str, ...] = (
    FORWARD,
    CALCULATE_LOSS_AND_BACKWARD,
    ZERO_GRAD,
    SGD_STEP,
    GET_PARAMETERS,
    PARAMETER_NAMES,
    GET_GRADIENTS,
    OPTIMIZER_STEP,
    TRAIN_STEP,
    TRAIN_EPOCH,
    EVALUATE,
    SET_PARAMETERS,
    BUFFER_NAMES,
    GET_BUFFERS,
    GET_LR,
    SET_LR,
    OPTIMIZER_STATE,
    LOAD_OPTIMIZER_STATE,
)

#: The methods a protocol-3 module runs (the required ones, the optional ones and the data-parallel ones).
PROTOCOL3_METHODS: tuple[str, ...] = REQUIRED_METHODS + (GET_LRS, SET_GROUP_LR, SCHEDULE_EPOCH, GRADIENT_FLAGS,
                                                         SET_GRADIENTS, GET_STATE, SET_STATE)

#: Methods a module may have; callers check for them (Java: TrainingModule.getLrs falls back to get_lr).
#: ``get_state(names)`` and ``set_state(names, values)`` read and write named parameters and buffers (a
#: version's trainable parameters and trained buffers, without the frozen rest); absent in modules exported
#: before them.
OPTIONAL_METHODS: tuple[str, ...] = (GET_LRS, SET_GROUP_LR, SCHEDULE_EPOCH, GET_STATE, SET_STATE)

#: Methods of protocol 2 that data-parallel training (gradbridge-spark) needs; version-1 modules lack them.
DATA_PARALLEL_METHODS: tuple[str, ...] = (GRADIENT_FLAGS, SET_GRADIENTS)

#: How a data-parallel step combines its partitions, as a gradbridge-spark run's history records it (its
#: ``sharded`` key's ``rule``; Java: ``Protocol.SHARDED_RULE``): the sample-weighted sum of the partitions'
#: gradients in partition order, the buffers of the step's first partition with rows, partition k's draws of
#: step s seeded with ``shuffle.step_seed(seed, s, k)``. ``reference.train_sharded`` replays it; a history of
#: another rule is refused.
SHARDED_RULE = "partition-order"

#: Keys of gradbridge.json, in the order they are written. Java's Metadata reads these names.
METADATA_KEYS: tuple[str, ...] = (
    "format",
    "protocol_version",
    "gradbridge_version",
    "torch_version",
    "model",
    "methods",
    "parameters",
    "buffers",
    "loss",
    "optimizer",
    "inputs",
    "custom_ops",
)

#: Keys that follow METADATA_KEYS only when they apply: ``fine_tuning`` (export, when set up: see
#: ``export.finetune.METADATA_KEY``), ``checkpoint`` (written by Java's checkpoints, below) and ``capture``.
FINE_TUNING_KEY = "fine_tuning"
CHECKPOINT_KEY = "checkpoint"
#: How the model was captured (absent in modules exported before it): ``{"kind": "script" | "trace",
#: "checked": bool, "draws_random": bool}``, ``checked`` when the export's check against the eager model ran
#: (``export.self_check``), ``draws_random`` when a training step draws from torch's generator (dropout:
#: ``export.step_writes``; absent in modules exported before it, read as true).
CAPTURE_KEY = "capture"
DRAWS_RANDOM_KEY = "draws_random"
#: ``capture``'s dtype of ``export_training_module(..., autocast=...)`` (``"bfloat16"``): the module's forward and
#: loss were captured under ``torch.autocast("cpu", dtype=...)``, which the eager reference enters too
#: (``_runtime.autocast``); absent without it.
AUTOCAST_KEY = "autocast"
#: ``capture``'s device the model was exported from when not the CPU (``"cuda:0"``); the file holds CPU
#: tensors either way, and trains on any device.
EXPORTED_FROM_KEY = "exported_from"
#: Protocol 3's program (``export.protocol3_capture``): ``{"oplist_version", "min_batch", "graphs": {name: entry},
#: "state": [{"name", "dtype", "shape", "file"}]}``; only in protocol-3 modules.
PROGRAM_KEY = "program"
OPTIONAL_METADATA_KEYS: tuple[str, ...] = (FINE_TUNING_KEY, CHECKPOINT_KEY, CAPTURE_KEY, PROGRAM_KEY)
#: How the trained weights go back into the user's model (``export.weights``; only where it has something to
#: say): ``{"tied": {KEY: NAME}, "peft": {"prefix": P, "adapters": {ADAPTER: {"config": TEXT, "keys": {K: KEY}}}}}``.
#: ``tied``: keys of the model's ``state_dict()`` that hold a parameter or buffer listed under another NAME (tied
#: embeddings). ``peft``: the model's one ``peft.PeftModel``, under prefix P (``""`` or ``"model."``), each adapter
#: with its ``adapter_config.json`` text and the keys of its ``adapter_model.safetensors``, each the state_dict KEY
#: it holds: what ``PeftModel.save_pretrained`` wrote of the exported model (``gradbridge state-dict --adapter``).
#: Python's alone: Java carries it into checkpoints (``Metadata.withCheckpoint`` copies the document; its Gson
#: drops members whose value is null, hence the config's text, not its object).
WEIGHTS_KEY = "weights"
WEIGHTS_TIED = "tied"
WEIGHTS_PEFT = "peft"
PYTHON_METADATA_KEYS: tuple[str, ...] = (WEIGHTS_KEY,)

#: Keys of a checkpoint's ``checkpoint`` entry (Java: ``Metadata.Checkpoint``): epochs done and the
#: seed, then what the run depends on, checked on resume (absent in older checkpoints). ``data_sha256``
#: is SHA-256(x bytes || y bytes); a gradbridge-spark run writes ``shards_sha256`` instead, SHA-256 over
#: each partition's SHA-256(x bytes || y bytes) in partition order (``reference.shards_sha256``).
CHECKPOINT_KEYS: tuple[str, ...] = ("epochs_completed", "seed", "batch_size", "mode", "x_shape", "y_shape",
                                    "data_sha256", "shards_sha256")

#: The dtypes data files hold (numpy's, torch's names without the ``torch.`` prefix).
DTYPES = ("float32", "float64", "int64")
#: The 16-bit floats: parameters and inputs of these dtypes are trained and recorded as they are.
LOW_PRECISION = ("bfloat16", "float16")
#: The dtypes of parameters and of the inputs (x, or several by name: ``gradbridge._runtime.inputs``) and y
#: (Java: ``MetadataSchema``'s): DTYPES and the 16-bit floats, trained and recorded as they are (optimizer
#: state of the parameter's dtype, as torch.optim keeps it); digests hash their 2-byte words, history
#: values are widened to float64 (exactly).
PARAMETER_DTYPES = DTYPES + LOW_PRECISION
INPUT_DTYPES = PARAMETER_DTYPES
#: The one rule for 16-bit inputs in data (numpy and Parquet have no bfloat16; Java: ``DType.carrier``): an
#: input (or y) of a LOW_PRECISION dtype arrives as CARRIER arrays (.npz, .npy, Parquet columns, arrays passed
#: from Python, the online service's features) holding values of that dtype exactly, and is cast to it when
#: loaded; a value the cast would round is refused in one line (``messages.not_exact``), never rounded. A
#: float16 input also takes float16 arrays as they are.
CARRIER = "float32"
#: The dtypes of buffers: every element type torch's CPU kernels handle that Java moves (Java's
#: ``dev.gradbridge.DType``, in its order; ``tests/test_pins.py`` ties the two). Complex, quantized,
#: float8 and the wider unsigned types are refused at export.
BUFFER_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bool", "bfloat16")


def tensor_spec(name: str, shape: Sequence[int], dtype: str, *, kind: str = "input") -> Dict[str, Any]:
    """One named tensor in the metadata (an input, or with ``kind="parameter"`` a parameter). ``-1``
    in ``shape`` marks the batch dimension."""
    allowed = PARAMETER_DTYPES if kind == "parameter" else INPUT_DTYPES
    if dtype not in allowed:
        raise DTypeError(messages.unsupported_dtype(kind, repr(name), dtype, allowed))
    return {"name": name, "shape": [int(d) for d in shape], "dtype": dtype}


def dtype_name(dtype: Any) -> str:
    """The metadata's name of a torch dtype (``torch.float32`` -> ``float32``)."""
    return str(dtype).replace("torch.", "")


def example_spec(name: str, example: Any) -> Dict[str, Any]:
    """The spec of a tensor of an example batch: its shape with the batch dimension (the first) as ``-1``."""
    return tensor_spec(name, [-1, *example.shape[1:]], dtype_name(example.dtype))


def buffer_spec(name: str, shape: Sequence[int], dtype: str, persistent: bool, trained: bool = False) -> Dict[str, Any]:
    """One buffer in the metadata, of any of ``BUFFER_DTYPES``; ``persistent: false`` marks one that
    torch keeps out of ``state_dict()`` (``register_buffer(..., persistent=False)``); ``trained: true`` one
    that a training step writes (BatchNorm's statistics: ``export.step_writes``), which online versions
    and Spark partitions carry with the parameters. Absent in modules exported before it: every buffer
    counts as trained then."""
    if dtype not in BUFFER_DTYPES:
        raise DTypeError(messages.unsupported_dtype("buffer", repr(name), dtype, BUFFER_DTYPES))
    return {"name": name, "shape": [int(d) for d in shape], "dtype": dtype, "persistent": bool(persistent),
            "trained": bool(trained)}


def build_metadata(
    *,
    model: str,
    parameters: List[Dict[str, Any]],
    buffers: List[Dict[str, Any]],
    loss: Dict[str, Any],
    optimizer: Dict[str, Any],
    inputs: List[Dict[str, Any]],
    torch_version: str,
    gradbridge_version: str,
    custom_ops: Sequence[str] = (),
    protocol_version: int = PROTOCOL_VERSION,
    methods: Sequence[str] = (),
    weights: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Assemble the gradbridge.json document (keys in ``METADATA_KEYS`` order), then ``WEIGHTS_KEY`` when
    ``weights`` has an entry."""
    document = {
        "format": METADATA_FORMAT,
        "protocol_version": protocol_version,
        "gradbridge_version": gradbridge_version,
        "torch_version": torch_version,
        "model": model,
        "methods": list(methods) or list(REQUIRED_METHODS) + list(OPTIONAL_METHODS) + list(DATA_PARALLEL_METHODS),
        "parameters": parameters,
        "buffers": buffers,
        "loss": loss,
        "optimizer": optimizer,
        "inputs": inputs,
        # Custom operators ("NS::NAME") the module calls; their libraries are loaded by the user.
        "custom_ops": list(custom_ops),
    }
    assert tuple(document) == METADATA_KEYS
    if weights:
        document[WEIGHTS_KEY] = weights
    return document


def read_metadata(path: str | Path) -> Dict[str, Any]:
    """Read gradbridge.json from an exported .pt without loading the module.

    Raises ProtocolError naming the file when it is not a TorchScript archive or carries no
    gradbridge metadata.
    """
    path = Path(path)
    if path.is_dir():
        raise ProtocolError(f"{path}: is a directory, not a training module (.pt)")
    if not path.is_file():
        raise ProtocolError(f"{path}: no such file")
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            # a TorchScript archive holds it under <name>/extra/, a protocol-3 zip at its root
            entries = [n for n in names if n.endswith("/extra/" + METADATA_FILE) or n == METADATA_FILE]
            if not entries and not any("/code/" in n for n in names):
                raise ProtocolError(f"{path}: a torch.save file, not a TorchScript archive; export the model "
                                    "with `gradbridge export`")
            if not entries:
                raise ProtocolError(
                    f"{path}: TorchScript archive without {METADATA_FILE}; "
                    "export it with `gradbridge export`"
                )
            with archive.open(entries[0]) as entry:  # bounded: an entry may inflate past any memory
                data = entry.read(METADATA_BYTES + 1)
            if len(data) > METADATA_BYTES:
                raise ProtocolError(f"{path}: {METADATA_FILE} inflates past the limit of {METADATA_BYTES} bytes")
            document = json.loads(data.decode("utf-8"))
    except zipfile.BadZipFile as ex:
        raise ProtocolError(f"{path}: not a TorchScript archive (not a zip file)") from ex
    except (UnicodeDecodeError, json.JSONDecodeError) as ex:
        raise ProtocolError(f"{path}: {METADATA_FILE} is not valid JSON: {ex}") from ex
    except RecursionError as ex:  # json's decoder recurses: a deeply nested text
        raise ProtocolError(f"{path}: {METADATA_FILE} is not valid JSON: nested too deep") from ex
    except (RuntimeError, NotImplementedError, zlib.error) as ex:  # an encrypted or damaged entry
        raise ProtocolError(f"{path}: {METADATA_FILE} is unreadable: {messages.one_line(ex)[:200]}") from ex
    check_schema(str(path), document)
    if document.get("protocol_version") not in SUPPORTED_VERSIONS:
        raise ProtocolError(f"{path}: protocol version {document.get('protocol_version')}, "
                            f"this gradbridge reads {', '.join(map(str, SUPPORTED_VERSIONS[:-1]))} and {SUPPORTED_VERSIONS[-1]}")
    return document


def check_schema(path: str, document: Any) -> None:
    """The shape of gradbridge.json: every key present with the right type, one line naming the
    first that is not. Java's ``MetadataSchema`` makes the same checks in the same order."""

    def fail(key: str, expected: str, value: Any = ...) -> ProtocolError:
        return ProtocolError(messages.metadata_key(path, key, expected,
                                                   messages.MISSING if value is ... else messages.json_text(value)))

    def string(obj: Dict[str, Any], key: str, where: str) -> str:
        if not isinstance(obj.get(key, ...), str):
            raise fail(where, "a string", obj.get(key, ...))
        return obj[key]

    def is_integer(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63)

    def array(obj: Dict[str, Any], key: str, where: str, expected: str) -> list:
        if not isinstance(obj.get(key, ...), list):
            raise fail(where, expected, obj.get(key, ...))
        return obj[key]

    def specs(key: str, dtypes: Sequence[str]) -> list:
        items = array(document, key, key, "a list of tensor specs")
        for i, spec in enumerate(items):
            where = f"{key}[{i}]"
            if not isinstance(spec, dict):
                raise fail(where, "an object with name, shape and dtype", spec)
            string(spec, "name", f"{where}.name")
            shape = array(spec, "shape", f"{where}.shape", "a list of integers")
            if not all(is_integer(d) for d in shape):
                raise fail(f"{where}.shape", "a list of integers", shape)
            if string(spec, "dtype", f"{where}.dtype") not in dtypes:
                raise fail(f"{where}.dtype", f"one of {', '.join(dtypes)}", spec["dtype"])
            for flag in ("persistent", "trained"):
                if not isinstance(spec.get(flag, True), bool):
                    raise fail(f"{where}.{flag}", "true or false", spec[flag])
        return items

    def named(key: str) -> None:
        if not isinstance(document.get(key, ...), dict):
            raise fail(key, "an object with a name", document.get(key, ...))
        string(document[key], "name", f"{key}.name")

    if not isinstance(document, dict):
        raise ProtocolError(messages.metadata_document(path, messages.json_text(document)))
    if string(document, "format", "format") != METADATA_FORMAT:
        raise ProtocolError(f"{path}: {METADATA_FILE} has format '{document['format']}', expected '{METADATA_FORMAT}'")
    if not is_integer(document.get("protocol_version", ...)):
        raise fail("protocol_version", "an integer", document.get("protocol_version", ...))
    for i, method in enumerate(array(document, "methods", "methods", "a list of strings")):
        if not isinstance(method, str):
            raise fail(f"methods[{i}]", "a string", method)
    specs("parameters", PARAMETER_DTYPES)
    specs("buffers", BUFFER_DTYPES)
    named("loss")
    named("optimizer")
    names = [spec["name"] for spec in specs("inputs", INPUT_DTYPES)]
    if len(names) < 2 or names[-1] != "y" or len(set(names)) != len(names):
        raise fail("inputs", messages.INPUT_SPECS, names)


def check_parameters(path: str, metadata: Dict[str, Any], names: Sequence[str], values: Sequence[Any]) -> None:
    """The module's parameters (names, dtypes, shapes) against what gradbridge.json declares."""
    declared = [spec["name"] for spec in metadata["parameters"]]
    if list(names) != declared:
        raise ProtocolError(f"{path}: parameter_names() returns {list(names)} but the metadata lists {declared}")
    for spec, value in zip(metadata["parameters"], values):
        dtype, shape = dtype_name(value.dtype), [int(d) for d in value.shape]
        if dtype != spec["dtype"] or shape != spec["shape"]:
            raise ProtocolError(messages.parameter_mismatch(path, spec["name"], f"{spec['dtype']} {spec['shape']}",
                                                            f"{dtype} {shape}"))
