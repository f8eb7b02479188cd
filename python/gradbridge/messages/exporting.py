"""The export: capture, its check against the user's eager model, a model's inputs, a torch newer than verified."""

from __future__ import annotations

from typing import Any, Optional, Sequence


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

#: What the metadata's ``inputs`` must hold (Java: ``InputMessages.INPUT_SPECS``).
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
    """An .npz array that is neither an input of the model nor y (Java: InputMessages.unknownArray; its
    Parquet twin, InputMessages.unknownColumn, is gradbridge-spark's for a model of several inputs)."""
    return (f"{source}: array {array} is not an input of the model (it takes [{', '.join(inputs)}] and y); "
            "an .npz holds exactly the model's inputs and y: drop the others")


def value_out_of_range(source: str, array: str, element: Optional[Sequence[int]], value: int, low: int,
                       high: int) -> str:
    """An id or label the model cannot take (a class past its classes, an id past its embedding's rows), found
    by ``data.out_of_range`` (Java: InputMessages.valueOutOfRange, ValueRanges). ``element``: where in a row, for rows
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
