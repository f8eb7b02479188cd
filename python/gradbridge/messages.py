"""The wording of error lines that both languages print, in one place.

``dev.gradbridge.internal.Messages`` holds the same sentences for Java; ``tests/test_faults_data_files.py``
and ``tests/test_faults_metadata.py`` check that both sides print the same line for the same
bad input. Every line names the file, key, array or argument at fault, and what was expected
versus what was found.
"""

from __future__ import annotations

import decimal
import json
import math
import re
from typing import Any, Optional, Sequence

LONG_MAX = (1 << 63) - 1


# ---- training runs ----

def batch_size(n: int, got: int) -> str:
    return f"batch size must be in 1..{n}, got {got}"


# ---- data files (.npz / .npy) ----

def big_endian(source: str, array: str, descr: str) -> str:
    little = "<" + descr[1:]
    return (f"{source}: array {array} has dtype {descr} (big-endian); expected little-endian {little}: "
            f"save it with {array}.astype('{little}')")


def fortran_order(source: str, array: str) -> str:
    return f"{source}: array {array} is stored in Fortran order; expected C order: save numpy.ascontiguousarray({array})"


def npy_size(source: str, array: str, shape: Sequence[int], descr: str, claimed: int, available: int) -> str:
    claimed_text = f"more than {LONG_MAX}" if claimed > LONG_MAX else str(claimed)
    return (f"{source}: array {array} header claims shape [{', '.join(map(str, shape))}] of {descr} "
            f"({claimed_text} bytes) but the file holds {available} bytes")


def npy_header(source: str, array: str, reason: str) -> str:
    return f"{source}: array {array} has no valid .npy header: {reason}"


# ---- training runs ----

def empty_dataset(source: str) -> str:
    return f"{source}: the dataset is empty (0 samples)"


#: How TorchScript starts an error raised inside a scripted method: its traceback (often thousands of
#: characters of code excerpts) comes first, the error's own line (``RuntimeError: Target 7 is out of
#: bounds.``) last.
TORCHSCRIPT_TRACEBACK = "The following operation failed in the TorchScript interpreter"
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]*\.)?\w*(?:Error|Exception): \S")
#: The longest torch reason a line carries (:func:`torch_reason`); a longer one is cut, with "...".
TORCH_REASON_LIMIT = 300


def one_line(ex: BaseException) -> str:
    """An exception's text on one line: the one rule for shortening torch's and libtorch's messages,
    which span several lines (whitespace collapsed; the exception's type when it says nothing). A
    TorchScript interpreter's traceback is left out: its last ``XxxError: ...`` line is the error (as
    Java's ``ModuleEngine.libtorchSummary`` keeps the last line)."""
    if TORCHSCRIPT_TRACEBACK in str(ex):
        lines = [line for line in str(ex).splitlines() if line.strip()]
        last = ([line for line in lines if _ERROR_LINE.match(line)] or lines)[-1]
        return " ".join(last.split())
    return " ".join(str(ex).split()) or type(ex).__name__


def torch_reason(ex: BaseException) -> str:
    """torch's reason for a failed call, for the end of a line: :func:`one_line`, at most
    TORCH_REASON_LIMIT characters (a longer one cut, with "...")."""
    line = one_line(ex)
    return line if len(line) <= TORCH_REASON_LIMIT else line[:TORCH_REASON_LIMIT] + "..."


def alternatives(items: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return items[-1] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def java_double(value: float) -> str:
    """A float as Java's Double.toString writes it: NaN, Infinity, -Infinity; the shortest digits,
    plain from 1e-3 up to 1e7 (``123.45``, ``1000000.0``) and as ``d.dddE±n`` outside (``3.0E38``)."""
    value = float(value)
    text = repr(value)
    if not math.isfinite(value) or value == 0 or 1e-3 <= abs(value) < 1e7:
        return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(text, text)
    sign, digits, exponent = decimal.Decimal(text).normalize().as_tuple()
    mantissa = "".join(map(str, digits))
    power = exponent + len(mantissa) - 1
    return f"{'-' if sign else ''}{mantissa[0]}.{mantissa[1:] or '0'}E{power}"


def unknown_mode(mode: Any) -> str:
    return f"unknown mode '{mode}'; expected full, step or fused"


def divergence(loss: float, epoch: int, batch: int, first: int, last: int) -> str:
    """A diverged run, before what was kept (Java adds its files, Python ``error.history``)."""
    return (f"loss is {java_double(loss)} at epoch {epoch}, batch {batch} (samples {first}..{last} "
            f"of the epoch's order); training stopped")


# ---- tensors against the metadata ----

def tensor_spec(source: str, name: str, dtype: str, shape: Sequence[int], actual_dtype: str,
                actual_shape: Sequence[int], carrier: Optional[str] = None) -> str:
    """``carrier``: the dtype data carries a 16-bit input as (``protocol.CARRIER``), None for the others."""
    where = f"{source}: " if source else ""
    carried = f" (as {carrier})" if carrier else ""
    return (f"{where}{name} must be {dtype}{carried} of shape {list(shape)} (-1: any number of samples), "
            f"got {actual_dtype} of shape {list(actual_shape)}")


#: Why a TorchScript export with ``autocast=`` traces the model (a script would drop autocast's casts).
AUTOCAST_TRACES = "not tried: autocast= traces the model under torch.autocast"


def autocast_refused(dtype: Any) -> str:
    return (f"autocast must be a dtype torch.autocast(\"cpu\", ...) takes (torch.bfloat16 or torch.float16), "
            f"got {dtype!r}")


def not_exact(source: str, name: str, index: Sequence[int], value: float, dtype: str, carrier: str) -> str:
    """A 16-bit input's ``carrier`` (``protocol.CARRIER``) holding a value its dtype does not (Java: ``Messages.notExact``)."""
    where = f"{source}: " if source else ""
    return (f"{where}{name}{list(index)} = {java_double(value)} is not a {dtype} value; gradbridge casts {carrier} data to "
            f"the model's {dtype} without rounding: round it first (torch.from_numpy(a).to(torch.{dtype}).float())")


# ---- metadata (gradbridge.json) ----

def json_text(value: Any, limit: int = 60) -> str:
    """A JSON value as compact JSON text (Gson's toString prints the same), shortened."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= limit else text[:limit - 3] + "..."


MISSING = "nothing (the key is missing)"


def metadata_key(path: str, key: str, expected: str, actual: str) -> str:
    return f"{path}: gradbridge.json key '{key}' must be {expected}, got {actual}"


def metadata_document(path: str, actual: str) -> str:
    return f"{path}: gradbridge.json must be a JSON object, got {actual}"


def parameter_mismatch(path: str, name: str, declared: str, actual: str) -> str:
    return f"{path}: parameter {name} is {actual} in the module but gradbridge.json declares {declared}"


def unsupported_dtype(kind: str, name: str, dtype: str, supported: Sequence[str]) -> str:
    """A tensor the export cannot carry (``kind``: parameter, buffer, input)."""
    return f"{kind} {name} has dtype {dtype}, which gradbridge does not support; {kind}s may be {', '.join(supported)}"


# ---- arguments ----

INT_MAX = (1 << 31) - 1


def argument(name: str, expected: str, actual: Any) -> str:
    return f"{name} must be {expected}, got {actual!r}"


def check_integer(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in ``low..high``, else InvalidInputError naming the argument.

    A float (``epochs=2.7``) or a bool is refused rather than truncated; numpy integers pass.
    """
    import numbers

    from .errors import InvalidInputError

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= int(value) <= high:
        raise InvalidInputError(argument(name, f"an integer in {low}..{high}", value))
    return int(value)


# ---- gradbridge bench ----

BENCH_ROUNDS = "rounds (an integer from 2 to 10000)"
BENCH_THREADS = "threads (an integer from 1 to 1024)"
ENV_ASSIGNMENT = "environment assignment (NAME=VALUE)"


def bench_needs(case: str, package: str) -> str:
    return f"bench case {case} needs the {package} package, which is not installed here: pip install {package}"


def bench_choice(what: str, allowed: Sequence[str]) -> str:
    """argparse's name for a comma-separated choice ("invalid <this> value: 'x'")."""
    return f"{what} (comma-separated, from {', '.join(allowed)})"


# ---- custom operators ----

def missing_custom_op(module: str, operator: str) -> str:
    return (f"{module} uses the custom operator {operator}, which no loaded library provides: "
            f"load its library first with --op-library FILE")


def op_library_unloadable(library: str, reason: str) -> str:
    return f"--op-library {library}: cannot load it: {reason}"


# why a file is not a shared library for this machine (checked before the dynamic linker maps it:
# a truncated library kills the process with SIGBUS instead of failing)

NOT_ELF = "not an ELF shared library"
ELF_TYPES = {0: "an ELF file of no type", 1: "a relocatable object (.o)", 2: "an executable", 4: "a core dump"}


def elf_class(bits: int) -> str:
    return f"a {bits}-bit ELF file; this machine loads 64-bit little-endian libraries"


def elf_type(e_type: int) -> str:
    return f"{ELF_TYPES.get(e_type, f'an ELF file of type {e_type}')}, not a shared library"


def elf_machine(found: int, machine: str, expected: int) -> str:
    return f"built for ELF machine {found}; this machine is {machine} (ELF machine {expected})"


def elf_truncated(needed: int, size: int) -> str:
    return f"truncated: its headers need {needed} bytes, the file has {size}"


# ---- the native layer: gradbridge's native library and its cache (Java: Messages, same sentences) ----

CACHE_ENV = "GRADBRIDGE_CACHE_DIR"


def digest_mismatch(recorded: str, actual: str) -> str:
    return f"its SHA-256 is {actual}, not the {recorded} recorded when it was built (damaged or replaced)"


def cache_damaged(what: str, folder: str, reason: str, action: str) -> str:
    return f"gradbridge: the cached {what} in {folder} is damaged ({reason}): {action}"


def cache_unwritable(folder: str, reason: str) -> str:
    return (f"cannot write gradbridge's cache folder {folder} ({CACHE_ENV}, by default ~/.cache/gradbridge): "
            f"{reason}; set {CACHE_ENV} to a writable folder")


def not_a_folder(path: str) -> str:
    """The reason for a cache folder under a path that is a file (GRADBRIDGE_CACHE_DIR naming one)."""
    return f"{path} is a file, not a folder"


def no_compiler(cxx: str | None, torch_version: str) -> str:
    if cxx is not None:
        return (f"CXX={cxx} names no compiler (not a file and not on PATH), needed to build gradbridge's native "
                f"library for torch {torch_version}: set CXX to a C++ compiler such as g++, or unset it")
    return (f"no C++ compiler to build gradbridge's native library for torch {torch_version}: install g++ "
            f"(e.g. apt-get install g++) or set CXX to one")


def jvm_options_refused(where: str, reason: str) -> str:
    """A JVM that does not start with the user's extra options (``GRADBRIDGE_JVM_OPTIONS=...``)."""
    return f"a JVM does not start with {where}: {reason}; correct or unset GRADBRIDGE_JVM_OPTIONS"


# ---- devices: where a module trains (Java: Messages, the same sentences) ----

#: The environment cuBLAS reads for reproducible results (set before CUDA starts), and its value on CUDA runs.
CUBLAS_WORKSPACE_CONFIG = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_WORKSPACE_VALUE = ":4096:8"


def unknown_device(device: Any) -> str:
    return f"unknown device '{device}'; expected cpu, cuda or cuda:N"


def device_unavailable(device: str, reason: str) -> str:
    return f"{device} is not available: {reason}"


def cuda_devices_seen(libtorch: str, count: int, driver: bool) -> str:
    seen = f"this libtorch ({libtorch}) sees {count} CUDA device{'' if count == 1 else 's'}"
    if count > 0:
        return f"{seen} (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
    return seen + ("" if driver else " (no NVIDIA driver: libcuda.so.1 does not load)")


def cuda_cpu_build(libtorch: str) -> str:
    return (f"this libtorch ({libtorch}) is a CPU build (no libtorch_cuda.so): use a CUDA build (pip's torch on "
            "Linux; for a JVM of its own, GRADBRIDGE_LIBTORCH=its torch/lib)")


def cuda_unloadable(file: str, reason: str) -> str:
    return f"cannot load {file}: {reason}"


def cublas_config_late(value: Optional[str]) -> str:
    """CUDA started in this process before the run set cuBLAS's workspace (Python only: a warning)."""
    return (f"CUDA started in this process before {CUBLAS_WORKSPACE_CONFIG} was set "
            f"({'unset' if value is None else repr(value)}): cuBLAS may not be reproducible; set "
            f"{CUBLAS_WORKSPACE_CONFIG}={CUBLAS_WORKSPACE_VALUE} before torch uses CUDA")


# ---- data-parallel training (gradbridge-spark, reference shards) ----

def data_parallel_methods(module: str, version: int, missing: Sequence[str]) -> str:
    return (f"{module}: protocol {version} module without {', '.join(missing)}, which data-parallel training "
            f"needs (protocol 2); re-export it with this gradbridge version")


def data_parallel_buffers(module: str, buffers: Sequence[str]) -> str:
    return (f"{module}: training writes its buffers [{', '.join(buffers)}] (e.g. BatchNorm statistics), and it has "
            f"no method set_state, which data-parallel training needs to keep them equal across partitions; "
            f"re-export it with this gradbridge version")


#: The most libtorch intra-op threads a run takes (Java: ModuleAccess.MAX_THREADS).
MAX_THREADS = 4096


def replay_threads(threads: int, previous: int, why: str) -> str:
    """The replay of a gradbridge-spark run on libtorch's ``threads`` (``why``: whence the count)."""
    line = f"replaying on {threads} intra-op thread{'s' if threads != 1 else ''}, {why}"
    return line if previous == threads else f"{line} (this process had {previous}; restored after)"


#: Whence a replay's thread count: the run's history, Spark's defaults, the caller.
THREADS_RECORDED = "as the Spark tasks ran ({} records it)"
THREADS_DEFAULT = "as the Spark tasks run on Spark's defaults (one core a task)"
THREADS_GIVEN = "as asked (threads={})"
#: What the replay of a gradbridge-spark run takes from each key of the run's history.
SPARK_HISTORY_KEYS = {"threads": "the tasks' intra-op thread count",
                      "sharded": "the run's partitions, batch size, seed and rule"}


def spark_history_key(where: str, key: str) -> str:
    return (f'{where}: no "{key}" key ({SPARK_HISTORY_KEYS[key]}), which the replay of a gradbridge-spark run takes '
            f"from its history: not a gradbridge-spark run's history, or one written before it recorded that "
            f"(replay such a run with reference.train_sharded(..., shards=, batch_size=, seed=, threads=))")


def spark_history_differs(where: str, key: str, value: Any, first: str) -> str:
    return (f"{where}: \"{key}\" is {json_text(value, 200)}, not as in {first}: one history, one run (replay each "
            f"run's history on its own)")


def spark_history_rule(where: str, rule: Any, known: str) -> str:
    return f'{where}: "sharded" holds rule {json_text(rule)}; this gradbridge replays the rule {json_text(known)} only'


def spark_history_order(where: str, epoch: int, previous: int) -> str:
    return f"{where}: epoch {epoch} after epoch {previous}; a run's history holds its epochs in order, each once"


def spark_history_data(source: str, history: str, partitions: int, actual: str, recorded: str) -> str:
    return (f"{source} is not the data {history}'s run trained on: its digest in {partitions} partitions "
            f"(shards_sha256) is {actual[:16]}..., the run's {recorded[:16]}...; replay it on the rows the run read")


def spark_history_option(option: str) -> str:
    return f"--spark-history replays the run with the settings its history records: {option} is not taken with it"


def input_too_large(name: str, index: Sequence[int], value: float, limit: float) -> str:
    """An online feedback or prediction input value beyond ``--max-input-abs`` (Java: Messages.inputTooLarge)."""
    return (f"field '{name}' element [{', '.join(map(str, index))}] is {java_double(value)}, beyond the input magnitude "
            f"limit {java_double(limit)} (--max-input-abs; 0 turns it off)")


def data_parallel_accumulate(module: str, accumulate: int) -> str:
    return (f"{module}: exported with accumulate={accumulate}; data-parallel training splits each mini-batch "
            f"over partitions instead: export it with accumulate=1")


# ---- export: capture and its check against the user's eager model (Python only) ----

#: What the user can do when the check refuses a capture; the skip flag is named once here.
CHECK_SKIP = "check=False (gradbridge export --no-check) skips this check"


def export_already_captured(kind: str) -> str:
    return (f"the model is already a TorchScript module ({kind}); pass the nn.Module itself: gradbridge scripts "
            "or traces it with its training step around it (a scripted or traced module receives no gradients)")


def unsupported_device(what: str, device: str) -> str:
    """A model or batch on a device gradbridge does not train on (the export writes CPU tensors, from a CPU
    or CUDA model; a run trains on the CPU or a CUDA device)."""
    return (f"{what} is on {device}; gradbridge takes models and tensors on the CPU or a CUDA device: "
            f"pass model.cpu() and CPU tensors (your model itself may stay where it is)")


def export_capture_failed(model: str, how: str, reason: str) -> str:
    return f"cannot {how} {model}: {reason}"


#: Whole messages libtorch lets through from C++: std::out_of_range of a map's ``at()`` (torch.jit.trace of
#: an HF decoder on transformers 4.57 ends so, ``_Map_base::at``).
_CXX_LOOKUP_FAILURES = ("_Map_base::at", "map::at", "unordered_map::at", "vector::_M_range_check")


def libtorch_internal(call: str, reason: str) -> str:
    """``reason`` in words where it is only a C++ exception's text (which names no cause a user can act on)."""
    if reason.strip() in _CXX_LOOKUP_FAILURES:
        return f"{call} failed inside libtorch (an internal lookup failed: {reason.strip()})"
    return reason


def export_output_not_tensor(model: str, output: str) -> str:
    return (f"{model} returns {output}, the loss needs one tensor: wrap the model so that forward returns it "
            "(e.g. an HF model's .logits)")


def export_needs_example(model: str, reason: str) -> str:
    return (f"cannot script {model}: {reason}; pass example_inputs=(x, y) to trace it "
            "instead")


def export_differs(method: str, tensor: str, element: int, eager: Any, exported: Any, capture: str) -> str:
    hint = {"trace": "the trace does not reproduce the model (Python control flow or values frozen at trace time); "
                     "make the model scriptable",
            # protocol 3's graphs run eager's kernels, but on the tensors the capture made (fresh, contiguous)
            "export": "the captured graph rounds it otherwise than eager (known: nn.GRU with a hidden size not a "
                      "multiple of 32); format=\"torchscript\" exports a model TorchScript scripts, or please report "
                      "it with the model"}.get(capture, "please report it with the model")
    if "after train_step" in method and capture != "export":
        # eval mode matched before any step: state kept across calls (timm LeViT's attention-bias cache)
        hint = ("the model keeps state across calls that its Python train() or eval() changes (e.g. a cache its "
                "train() clears, as timm's LeViT), which the TorchScript module never runs; export with "
                "format=\"export\"")
    return (f"export check failed: {method}: {tensor} differs from your eager model at element {element}: "
            f"eager {eager!r}, exported {exported!r}; {hint}; {CHECK_SKIP}")


def export_batch_size_frozen(method: str, rows: int, reason: str) -> str:
    return (f"export check failed: {method} raised: {reason}; the trace holds the example's batch size ({rows}) "
            f"and cannot train or predict on another (online micro-batches, Spark partitions); make the model "
            f"scriptable or export it with format=\"export\"; {CHECK_SKIP}")


def export_mismatch(method: str, tensor: str, eager: str, exported: str) -> str:
    return (f"export check failed: {method}: {tensor} is {exported} in the export but {eager} in your eager model; "
            f"{CHECK_SKIP}")


def export_check_raised(method: str, reason: str) -> str:
    return f"export check failed: {method} raised: {reason}; {CHECK_SKIP}"


def export_random_draws(method: str, eager: str, exported: str, capture: str) -> str:
    lost = " (a trace drops random draws whose result only steers Python control flow)" if capture == "trace" else ""
    return (f"export check failed: {method}: your eager model draws random numbers as {eager}, the export as "
            f"{exported}{lost}: its random masks would differ from step one; make the model scriptable or remove "
            f"the draw; {CHECK_SKIP}")


# ---- a model's inputs (gradbridge._runtime.inputs; Java: dev.gradbridge.Inputs) ----

#: What the metadata's ``inputs`` must hold (Java: ``Messages.INPUT_SPECS``).
INPUT_SPECS = "the specs of the model's inputs (x, or several by name) then y, each name once"

def inputs_unnamed(model: str, count: int) -> str:
    return (f"example inputs: {count} tensors but {model}.forward does not name {count} parameters to pass them to; "
            "pass a dict naming each input (e.g. {'input_ids': ..., 'attention_mask': ...})")


def inputs_kind(kind: str) -> str:
    return f"example inputs: expected a tensor, a tuple of tensors or a dict of named tensors, got {kind}"


def input_not_tensor(name: str, kind: str) -> str:
    return f"input {name}: expected a tensor, got {kind}"


def input_name(name: Any) -> str:
    return (f"input name {name!r}: expected a Python identifier other than 'y' (the target) naming a parameter "
            "of the model's forward")


def input_name_twice(names: Sequence[str]) -> str:
    return f"inputs {list(names)}: each input name must appear once"


def input_not_a_parameter(model: str, name: str, takes: Sequence[str]) -> str:
    return f"input {name}: {model}.forward has no parameter {name!r} (it takes {', '.join(takes) or 'none by name'})"


def input_missing(source: str, name: str, holds: Sequence[str], needs: Sequence[str]) -> str:
    """A data file without an array the module needs (``needs``: the inputs then y)."""
    return (f"{source}: missing array '{name}'; the file holds [{', '.join(holds)}] "
            f"(save with numpy.savez(path, {', '.join(n + '=...' for n in needs)}))")


def unknown_array(source: str, array: str, inputs: Sequence[str]) -> str:
    """An .npz array that is neither an input of the model nor y (Java: Messages.unknownArray; its
    Parquet twin, Messages.unknownColumn, is gradbridge-spark's for a model of several inputs)."""
    return (f"{source}: array {array} is not an input of the model (it takes [{', '.join(inputs)}] and y); "
            "an .npz holds exactly the model's inputs and y: drop the others")


def value_out_of_range(source: str, array: str, element: Optional[Sequence[int]], value: int, low: int,
                       high: int) -> str:
    """An id or label the model cannot take (a class past its classes, an id past its embedding's rows), found
    by ``data.out_of_range`` (Java: Messages.valueOutOfRange, ValueRanges). ``element``: where in a row, for rows
    of more than one value; ``low``..``high``: the range the model takes there, searched from 0."""
    at = "" if element is None else f" at element [{', '.join(map(str, element))}] of a row"
    there = "" if element is None else " there"
    return f"{source}: {array} holds {value}{at}, outside the range the model takes{there} ({low}..{high})"


# ---- a torch newer than the verified releases (gradbridge._runtime.torch_gate, gradbridge verify) ----

def _newer(version: str, verified: str) -> str:
    return f"torch {version} is newer than the releases gradbridge verified (up to {verified}.x)"


def torch_self_check_starts(version: str, verified: str) -> str:
    return f"{_newer(version, verified)}: checking it once on this machine (`gradbridge verify`, about a minute) ..."


def torch_unchecked(version: str, verified: str, env: str) -> str:
    return (f"{_newer(version, verified)} and was not self-checked on this machine: run `gradbridge verify` "
            f"first (with {env}=0 it does not run on first use)")


def torch_unchecked_status(version: str, verified: str) -> str:
    return (f"not self-checked yet ({_newer(version, verified)}): the first training runs `gradbridge verify`, "
            f"or run it now")


def torch_self_check_failed(version: str, line: str) -> str:
    return (f"torch {version} failed gradbridge's self-check on this machine: {line}; Java would not match eager "
            f"torch here: use a verified torch, or run `gradbridge verify` again after a fix")


def torch_self_check_incomplete(version: str, reason: str) -> str:
    return f"the self-check of torch {version} (`gradbridge verify`) did not finish: {reason}"


def torch_self_check_unfinished(group: str, reason: str) -> str:
    """A self-check the machine stopped (a full disk, a cache folder it cannot write, a build that failed):
    not a verdict on this torch, so nothing is recorded."""
    return f"{group}: {reason}; nothing recorded: the next run checks this torch again"


def torchscript_unavailable(version: str, call: str, reason: str) -> str:
    return (f"torch {version} refuses {call} ({reason}): gradbridge's training modules are TorchScript, which "
            f"this torch no longer runs; use a torch that does (see `gradbridge doctor`)")


# ---- protocol 3 (export_training_module(..., format="export")) ----

def aten_option_refused(option: str) -> str:
    return f"format='export' does not support {option} yet; export with format='torchscript' or leave it out"


def auto_took_export(reason: str) -> str:
    return f"format='auto' exported protocol 3 (torch.export), as TorchScript cannot: {reason}"


def auto_neither(torchscript: str, export: str) -> str:
    return f"{torchscript}; and protocol 3 (format='export') cannot either: {export}"


def format_chosen(kind: str, by_auto: bool) -> str:
    """Which format an export took, from its capture kind (script, trace, export), in words."""
    if kind == "export":
        return "protocol 3, torch.export" + (": TorchScript cannot capture it" if by_auto else "")
    return f"TorchScript, {'traced' if kind == 'trace' else 'scripted'}"


def aten_optimizer_refused(name: str, supported: Any) -> str:
    return f"format='export' does not support optimizer {name} yet (it exports {', '.join(supported)})"


def aten_capture_failed(model: str, reason: str) -> str:
    return f"torch.export cannot capture {model}'s training step: {reason}"


def aten_data_dependent(at: str) -> str:
    return (f"the model's Python code depends on the values in its tensors (a branch or a size computed from data "
            f"or a random draw), which one graph cannot hold{at}")


def aten_batch_dependent(reason: str) -> str:
    return (f"format='export': the captured graph depends on the batch size beyond its sizes ({reason}); "
            "export with format='torchscript'")


def aten_batch_too_small(batch: int, minimum: int) -> str:
    return f"format='export' needs an example batch of at least {minimum} samples, got {batch}"


def aten_no_gradient(model: str) -> str:
    return f"format='export': no trainable parameter of {model} gets a gradient from the loss; nothing to train"


def aten_unbound(name: str) -> str:
    return f"format='export': a graph reads {name}, which the model does not hold"


def aten_micro_batches_too_small(batch: int, accumulate: int, sizes: Any, minimum: int) -> str:
    return (f"format='export': accumulate={accumulate} splits a batch of {batch} into micro-batches of {sizes}; "
            f"protocol 3 runs micro-batches of at least {minimum} samples for a model it cannot capture at one sample "
            f"(eager refuses one too: BatchNorm in training): pick another example batch size")


def program_entry_missing(path: str, entry: str) -> str:
    return f"{path}: the protocol-3 module lacks {entry} (a truncated or edited file); export it again"


def program_version(path: str, version: Any, supported: int) -> str:
    return f"{path}: op-list version {version}, this gradbridge runs version {supported}; export the model again with this gradbridge"


def program_state_mismatch(path: str, name: str, expected: str, actual: str) -> str:
    return f"{path}: state tensor {name} is {actual}, expected {expected} (an edited file); export it again"


def program_state_bytes(path: str, file: str, size: int, name: str, spec: str, needed: int) -> str:
    return f"{path}: {file} holds {size} bytes, {name} ({spec}) needs {needed} (a truncated or edited file)"


def program_unreadable(path: str, reason: str) -> str:
    return f"{path}: not a readable protocol-3 module: {reason}"


def protocol3_needs_model(path: str) -> str:
    return (f"{path}: a protocol-3 module (format='export') holds no Python model: pass model= (your eager "
            "nn.Module; on the command line --model-factory MODULE:FACTORY) to compare against")


def protocol3_not_torchscript(path: str) -> str:
    return (f"{path}: a protocol-3 module (format='export') is not TorchScript; this command reads TorchScript "
            "modules only for now (Java's TrainingModule and Trainer, java.train and reference.train(model=...) "
            "take it)")


# ---- gradbridge state-dict (export.weights) ----

def weights_suffix(path: str, suffix: str, known: Any) -> str:
    shown = f"suffix '{suffix}'" if suffix else "no suffix"
    return (f"{path}: cannot tell the format from {shown}: name it {known}, or choose one with --format "
            "(format= in Python)")


def weights_format(value: Any, known: Any) -> str:
    return f"state_dict format must be one of {', '.join(known)}, got {value!r}"


def weights_left_out(path: str, count: int, first: str) -> str:
    return (f"{path} leaves out {count} frozen tensors ({first}, ...): an online learner's checkpoint holds what "
            "training changed; pass the module file it learned from as base (gradbridge state-dict --base MODEL)")


def weights_other_base(base: str, name: str, shape: list, path: str) -> str:
    return f"{base}: holds no {name} of shape {shape}, which {path} leaves out: not the module file it learned from"


def weights_nothing_asked() -> str:
    return "state-dict: give -o FILE (the whole state_dict), --adapter DIR (a PEFT model's adapter) or both"


def weights_no_adapter(path: str) -> str:
    return (f"{path}: --adapter: the module records no PEFT adapter (its model holds no peft.PeftModel, or it was "
            "exported before gradbridge recorded adapters: export it again); -o FILE writes the whole state_dict")


def weights_adapter_key(path: str, adapter: str, key: str) -> str:
    return (f"{path}: adapter '{adapter}' names state_dict key {key}, which the module's model lacks "
            "(an edited file); export it again")


def weights_not_recorded(reason: str) -> str:
    return f"the export records no PEFT adapter (gradbridge state-dict --adapter will refuse it): {reason}"
