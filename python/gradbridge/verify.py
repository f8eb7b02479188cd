"""`gradbridge verify`: the fast parity cases the project's tests run on every torch, on the installed
torch, from the installed package, in a temporary folder: about a minute.

Groups, one progress line each, stopping at the first case that differs:

1. **native library**: gradbridge's JNI layer compiled for this torch (``native.ensure``).
2. **TorchScript**: this torch still scripts, saves and loads a module (``torchscript.require_available``).
3. **losses**: every scripted loss against its ``torch.nn.functional`` call, value and gradient
   (tests/test_losses.py runs the same cases).
4. **optimizers**: every scripted optimizer variant against ``torch.optim``, step by step: losses,
   parameters, buffers, optimizer state (tests/test_optim.py runs the same comparison).
5. **in-process Java**: a few exported models trained by Java in this process and by eager torch
   (``java.train`` against ``reference.train``, ``parity.compare_histories``, bit for bit).

The verdict is recorded per torch build (``torch_gate.record``): the gate before every training run
reads it for a torch newer than the verified releases. A run the machine stops (:func:`unfinished`: the
native library cannot be built, a file cannot be written) is no verdict: one line, nothing recorded.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from . import messages
from ._runtime import libtorch, torch_gate
from .export.check_trail import first_difference
from .models import SmallCNN, linear, mlp

#: Every optimizer option the exporter supports, one case each (also tests/test_optim.py and
#: tests/test_parity_java_general.py, through tests/matrix.py).
OPTIMIZER_VARIANTS: Dict[str, dict] = {
    "sgd": {"name": "sgd", "lr": 0.05},
    "sgd-momentum-dampening": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.1},
    "sgd-nesterov-wd": {"name": "sgd", "lr": 0.01, "momentum": 0.8, "nesterov": True,
                        "weight_decay": 1e-3},
    "adam": {"name": "adam", "lr": 1e-2},
    "adam-amsgrad-wd": {"name": "adam", "lr": 1e-2, "betas": [0.8, 0.99], "weight_decay": 1e-2, "amsgrad": True},
    "adamw": {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1},
    "rmsprop-centered-momentum": {"name": "rmsprop", "lr": 1e-3, "momentum": 0.5, "centered": True,
                                  "weight_decay": 1e-3},
    "adagrad": {"name": "adagrad", "lr": 5e-2, "lr_decay": 1e-3, "weight_decay": 1e-3,
                "initial_accumulator_value": 0.1},
    "sgd-maximize": {"name": "sgd", "lr": 1e-3, "maximize": True},
}

#: The optimizer cases' models: (factory, input shape of one sample); three classes.
OPTIMIZER_MODELS: Dict[str, Tuple[Callable[[], torch.nn.Module], Tuple[int, ...]]] = {
    "mlp": (lambda: mlp(in_features=6, hidden=(16, 16), out_features=3), (6,)),
    "cnn-batchnorm": (lambda: SmallCNN(side=8, channels=4, classes=3), (1, 8, 8)),
    "mlp-dropout": (lambda: mlp(in_features=6, hidden=(16, 16), out_features=3, dropout=0.3), (6,)),
}
OPTIMIZER_BATCH = 16


def classification_data(shape: Sequence[int], n: int = 64, classes: int = 3) -> Tuple[torch.Tensor, torch.Tensor]:
    """Random inputs of ``shape`` per sample and class labels, from a fixed generator."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, *shape, generator=generator)
    y = torch.randint(0, classes, (n,), generator=generator)
    return x, y


def _first_difference(expected: Dict[str, torch.Tensor], actual: Dict[str, torch.Tensor], what: str) -> Optional[str]:
    if expected.keys() != actual.keys():
        return f"{what} names differ: {sorted(expected)} vs {sorted(actual)}"
    for name in expected:
        same_kind = expected[name].dtype == actual[name].dtype and expected[name].shape == actual[name].shape
        if not same_kind or first_difference(expected[name], actual[name]) is not None:
            delta = (expected[name].double() - actual[name].double()).abs().max().item()
            return f"{what} {name} differs by {delta:.3e}"
    return None


def optimizer_difference(path: Path, model: torch.nn.Module, batches: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                         steps: int) -> Optional[str]:
    """The first difference between ``steps`` train_step calls of the exported module at ``path`` and
    eager torch.optim on ``model`` (losses, parameters, buffers, optimizer state and its keys), or None when every
    step has the same bits. Both start from the same generator state (dropout draws the same masks)."""
    from .reference import Reference
    from ._runtime.torchscript import load, plain_graph_executor

    reference = Reference(path, model)
    scripted = load(str(path))
    names, buffer_names = scripted.parameter_names(), scripted.buffer_names()
    torch.manual_seed(1234)
    eager = []
    for step in range(steps):
        loss = reference.train_step(*batches[step % len(batches)])
        eager.append((loss, reference.parameters(), reference.buffers(), reference.optimizer_state()))
    torch.manual_seed(1234)
    with plain_graph_executor():
        for step in range(steps):
            loss = scripted.train_step(*batches[step % len(batches)])
            expected_loss, params, buffers, state = eager[step]
            if not torch.equal(loss, expected_loss):
                return f"step {step}: loss {loss.item()!r} vs torch.optim's {expected_loss.item()!r}"
            exported_state = scripted.optimizer_state()
            if exported_state.keys() != state.keys():
                return f"step {step}: optimizer state keys {sorted(exported_state)} vs torch.optim's {sorted(state)}"
            differences = [_first_difference(params, dict(zip(names, scripted.get_parameters())), "parameter"),
                           _first_difference(buffers, dict(zip(buffer_names, scripted.get_buffers())), "buffer")]
            differences += [_first_difference(dict(enumerate(values)), dict(enumerate(exported_state[key])),
                                              f"optimizer state {key}") for key, values in state.items()]
            first = next((d for d in differences if d), None)
            if first:
                return f"step {step}: {first}"
    return None


def _loss_inputs(n: int = 12, c: int = 5):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, c, generator=g)
    classes = torch.randint(0, c, (n,), generator=g)
    classes[3] = 1
    real = torch.randn(n, c, generator=g)
    probabilities = torch.rand(n, c, generator=g)
    return logits, classes, real, probabilities


def loss_cases() -> List[Tuple[dict, torch.Tensor, torch.Tensor, Callable]]:
    """Every exported loss with options: (spec, prediction, target, the torch.nn.functional call)."""
    logits, classes, real, probabilities = _loss_inputs()
    weights = [0.5, 1.0, 2.0, 1.5, 0.1]
    log_probabilities = F.log_softmax(logits, 1)
    return [
        ({"name": "mse"}, logits, real, lambda p, t: F.mse_loss(p, t)),
        ({"name": "mse", "reduction": "sum"}, logits, real, lambda p, t: F.mse_loss(p, t, reduction="sum")),
        ({"name": "l1"}, logits, real, lambda p, t: F.l1_loss(p, t)),
        ({"name": "l1", "reduction": "sum"}, logits, real, lambda p, t: F.l1_loss(p, t, reduction="sum")),
        ({"name": "smooth_l1", "beta": 0.5}, logits, real, lambda p, t: F.smooth_l1_loss(p, t, beta=0.5)),
        ({"name": "smooth_l1", "beta": 0.0, "reduction": "sum"}, logits, real,
         lambda p, t: F.smooth_l1_loss(p, t, beta=0.0, reduction="sum")),
        ({"name": "huber", "delta": 0.7}, logits, real, lambda p, t: F.huber_loss(p, t, delta=0.7)),
        ({"name": "cross_entropy"}, logits, classes, lambda p, t: F.cross_entropy(p, t)),
        ({"name": "cross_entropy", "weight": weights, "label_smoothing": 0.2}, logits, classes,
         lambda p, t: F.cross_entropy(p, t, weight=torch.tensor(weights), label_smoothing=0.2)),
        ({"name": "cross_entropy", "ignore_index": 1, "reduction": "sum"}, logits, classes,
         lambda p, t: F.cross_entropy(p, t, ignore_index=1, reduction="sum")),
        ({"name": "nll"}, log_probabilities, classes, lambda p, t: F.nll_loss(p, t)),
        ({"name": "nll", "weight": weights, "ignore_index": 1}, log_probabilities, classes,
         lambda p, t: F.nll_loss(p, t, weight=torch.tensor(weights), ignore_index=1)),
        ({"name": "bce_with_logits"}, logits, probabilities, lambda p, t: F.binary_cross_entropy_with_logits(p, t)),
        ({"name": "bce_with_logits", "pos_weight": weights, "reduction": "sum"}, logits, probabilities,
         lambda p, t: F.binary_cross_entropy_with_logits(p, t, pos_weight=torch.tensor(weights), reduction="sum")),
    ]


def loss_difference(spec: dict, prediction: torch.Tensor, target: torch.Tensor, expected: Callable) -> Optional[str]:
    """The scripted loss against the direct call: the first of value and gradient that differs, or None."""
    from .spec import losses
    from ._runtime.torchscript import script

    module = script(losses.build(spec))
    ours, theirs = prediction.clone().requires_grad_(True), prediction.clone().requires_grad_(True)
    loss, reference = module(ours, target), expected(theirs, target)
    if not torch.equal(loss, reference):
        return f"loss {loss.item()!r} vs torch.nn.functional's {reference.item()!r}"
    (grad,) = torch.autograd.grad([loss], [ours])
    (reference_grad,) = torch.autograd.grad([reference], [theirs])
    if not torch.equal(grad, reference_grad):
        return f"gradient differs by {(grad - reference_grad).abs().max().item():.3e}"
    return None


@dataclass(frozen=True)
class JavaCase:
    """A model trained by Java in this process and by eager torch, compared bit for bit."""
    name: str
    build: Callable[[], torch.nn.Module]
    shape: Tuple[int, ...]
    loss: str
    optimizer: dict
    mode: str


JAVA_CASES = [
    JavaCase("mlp-regression", lambda: mlp(4, (16,), 1), (4,), "mse", {"name": "adam", "lr": 0.01}, "step"),
    JavaCase("cnn-batchnorm", lambda: SmallCNN(side=8, channels=4, classes=3), (1, 8, 8), "cross_entropy",
             OPTIMIZER_VARIANTS["sgd-nesterov-wd"], "fused"),
    JavaCase("mlp-dropout", lambda: mlp(6, (16, 16), 3, dropout=0.3), (6,), "cross_entropy",
             OPTIMIZER_VARIANTS["adamw"], "step"),
    JavaCase("logistic-full-batch", lambda: linear(6, 1), (6,), "bce_with_logits",
             OPTIMIZER_VARIANTS["rmsprop-centered-momentum"], "full"),
]
JAVA_EPOCHS = 3
JAVA_BATCH = 16


def java_difference(case: JavaCase, folder: Path) -> Optional[str]:
    """Export ``case``, train it with Java in this process and with eager torch; the first difference
    (``ParityReport.divergence``) or None when every epoch has the same bits."""
    from . import export_training_module, java, reference
    from .parity import compare_histories

    rng = np.random.default_rng(7)
    x = rng.normal(size=(60, *case.shape)).astype(np.float32)
    if case.loss == "mse":
        y = x.sum(axis=1, keepdims=True).astype(np.float32)
    elif case.loss == "bce_with_logits":
        y = (x[:, :1] > 0).astype(np.float32)
    else:
        y = rng.integers(0, 3, size=len(x)).astype(np.int64)
    torch.manual_seed(0)
    path = export_training_module(case.build(), case.loss, case.optimizer, folder / f"{case.name}.pt",
                                  example_inputs=(torch.from_numpy(x[:2]), torch.from_numpy(y[:2])),
                                  model_name=case.name)
    settings = dict(epochs=JAVA_EPOCHS, batch_size=JAVA_BATCH, seed=3, mode=case.mode)
    report = compare_histories(reference.train(path, x, y, **settings), java.train(path, x, y, **settings))
    return None if report.bitwise else report.divergence()


@dataclass(frozen=True)
class Difference:
    """A case whose result is not eager torch's: its name and the first difference."""
    case: str
    detail: str


def _native(folder: Path) -> Union[str, Difference]:
    from ._runtime import native

    return f"built for torch {torch.__version__} ({native.ensure(quiet=True).name})"


def _torchscript(folder: Path) -> Union[str, Difference]:
    from ._runtime import torchscript

    torchscript.require_available()
    return "scripts, saves and loads"


def _losses(folder: Path) -> Union[str, Difference]:
    cases = loss_cases()
    for spec, prediction, target, expected in cases:
        difference = loss_difference(spec, prediction, target, expected)
        if difference:
            return Difference(", ".join(f"{k}={v}" for k, v in spec.items()), difference)
    return f"{len(cases)} cases bitwise with torch.nn.functional (value and gradient)"


#: (model, optimizer variant, steps) of the optimizer group: every variant on the dropout MLP, and
#: BatchNorm's buffers under two of them.
OPTIMIZER_CASES = ([("mlp-dropout", name, 20) for name in OPTIMIZER_VARIANTS]
                   + [("cnn-batchnorm", "adam", 10), ("cnn-batchnorm", "sgd-momentum-dampening", 10)])


def _optimizers(folder: Path) -> Union[str, Difference]:
    from . import export_training_module

    for model_name, variant, steps in OPTIMIZER_CASES:
        factory, shape = OPTIMIZER_MODELS[model_name]
        torch.manual_seed(0)
        model = factory()
        x, y = classification_data(shape)
        path = export_training_module(model, "cross_entropy", OPTIMIZER_VARIANTS[variant],
                                      folder / f"{model_name}-{variant}.pt",
                                      example_inputs=(x[:OPTIMIZER_BATCH], y[:OPTIMIZER_BATCH]))
        batches = [(x[i:i + OPTIMIZER_BATCH], y[i:i + OPTIMIZER_BATCH]) for i in range(0, len(x), OPTIMIZER_BATCH)]
        difference = optimizer_difference(path, model, batches, steps)
        if difference:
            return Difference(f"{variant} on {model_name}", difference)
    return f"{len(OPTIMIZER_CASES)} cases bitwise with torch.optim at every step"


def _java(folder: Path) -> Union[str, Difference]:
    for case in JAVA_CASES:
        difference = java_difference(case, folder)
        if difference:
            return Difference(case.name, difference)
    return (f"{len(JAVA_CASES)} models x {JAVA_EPOCHS} epochs ({', '.join(sorted({c.mode for c in JAVA_CASES}))}) "
            "bitwise with eager torch")


#: The groups in order: (name, function(folder) -> summary, or the first case that differs).
GROUPS: List[Tuple[str, Callable[[Path], Union[str, Difference]]]] = [
    ("native library", _native), ("TorchScript", _torchscript), ("losses", _losses),
    ("optimizers", _optimizers), ("in-process Java", _java),
]


@dataclass(frozen=True)
class Verdict:
    passed: bool
    #: on failure, "group / case: first difference"; on success, a summary
    line: str
    seconds: float


#: The group that builds: its failure is the machine's (a compiler, a disk), never a verdict on this torch.
BUILD_GROUP = "native library"
#: What torch says when it cannot write a file (torch.save, torch.jit.save on a full disk).
_TORCH_WRITE_FAILED = "file write failed"


def unfinished(group: str, ex: BaseException) -> bool:
    """Whether ``ex`` in ``group`` stopped the self-check for a reason of this machine, not of this torch:
    the native library could not be built, a file could not be written (a full disk, a cache folder that
    is a file or read-only). Such a run records nothing: the next one checks this torch again."""
    from ._runtime import native

    text = str(ex)
    return (group == BUILD_GROUP or isinstance(ex, OSError)
            or any(words in text for words in (*native.DISK_ERRORS, _TORCH_WRITE_FAILED)))


def _machine_reason(ex: BaseException) -> str:
    """An unfinished run's reason: gradbridge's own line, the file and the system's words, or torch's."""
    from .errors import GradbridgeError

    if isinstance(ex, GradbridgeError):
        return messages.one_line(ex)
    if isinstance(ex, OSError) and ex.strerror:
        return f"{ex.filename}: {ex.strerror}" if ex.filename else ex.strerror
    return f"{type(ex).__name__}: {messages.one_line(ex)}"


def run(out: Callable[[str], None] = print) -> Verdict:
    """Run every group on this torch, print one line per group, record the verdict for this torch build.

    SetupError (:func:`messages.torch_self_check_unfinished`) when the machine stopped it (:func:`unfinished`):
    then nothing is recorded."""
    from .errors import GradbridgeError, SetupError

    build = torch_gate.torch_build()
    verified = libtorch.is_verified(libtorch.torch_version())
    out(f"gradbridge verify: torch {build.version} (build {build.build_hash}), "
        f"{'a' if verified else 'newer than every'} verified release (up to {libtorch.verified_up_to()}.x)")
    started = time.monotonic()
    failure = None
    try:
        scratch_folder = tempfile.TemporaryDirectory(prefix="gradbridge-verify-")
    except OSError as ex:  # a full temp folder
        raise SetupError(messages.torch_self_check_unfinished("its temp folder", _machine_reason(ex))) from ex
    with torch_gate.checking(), scratch_folder as scratch:
        for name, group in GROUPS:
            began = time.monotonic()
            try:
                summary = group(Path(scratch))
                if isinstance(summary, Difference):
                    failure = f"{name} / {summary.case}: {summary.detail}"
            except Exception as ex:  # whatever this torch raises in a case is that case's failure
                reason = messages.one_line(ex)
                if unfinished(name, ex):
                    reason = _machine_reason(ex)
                    out(f"  {name:<16} not run: {reason}")
                    raise SetupError(messages.torch_self_check_unfinished(name, reason)) from ex
                failure = f"{name}: {reason if isinstance(ex, GradbridgeError) else f'{type(ex).__name__}: {reason}'}"
            if failure:
                out(f"  {name:<16} FAILED: {failure}")
                break
            out(f"  {name:<16} ok: {summary} ({time.monotonic() - began:.1f} s)")
    seconds = time.monotonic() - started
    verdict = Verdict(failure is None, failure or f"{len(GROUPS)} groups passed", seconds)
    path = torch_gate.record(verdict.passed, verdict.line, seconds, build)
    out(f"{'passed' if verdict.passed else 'FAILED'} in {seconds:.0f} s; verdict recorded in {path}")
    return verdict
