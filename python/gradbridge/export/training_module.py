"""``export_training_module`` and ``export_builtin``: check the model, loss, optimizer and fine-tuning
options, script the wrapper (``scripted_module._TrainingModule``: parameters, buffers, gradients and the
protocol's methods), check it against the declared tensors, and write it with its metadata."""


import copy
import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from .._runtime import autocast as autocast_region, inputs as model_inputs, libtorch, ops, torchscript
from .. import messages, protocol
from .._version import __version__
from ..errors import CaptureError, ExportError, TorchScriptUnavailableError  # ExportError: also from here
from .._runtime.files import atomic_path
from ..models import BUILTIN_MODELS, SEED_LR
from ..spec import losses, optim
from . import capture as model_capture, check_trail, finetune, protocol3_capture, self_check, step_writes, weights
from .scripted_module import _SeveralInputs, _TrainingModule

log = logging.getLogger(__name__)

SUPPORTED_LOSSES = tuple(losses.LOSSES)
SUPPORTED_OPTIMIZERS = tuple(optim.OPTIMIZERS)


def export_training_module(
    model: nn.Module,
    loss: Union[str, Dict[str, Any], nn.Module],
    optimizer: Union[str, Dict[str, Any], torch.optim.Optimizer],
    path: Union[str, os.PathLike],
    *,
    example_inputs: Optional[Tuple[Any, Tensor]] = None,
    inputs: Optional[Sequence[Dict[str, Any]]] = None,
    model_name: Optional[str] = None,
    freeze: Sequence[str] = (),
    scheduler: Any = None,
    scheduler_interval: str = "step",
    clip_grad_norm: Optional[float] = None,
    clip_norm_type: float = 2.0,
    clip_grad_value: Optional[float] = None,
    accumulate: int = 1,
    init_weights: Union[None, str, os.PathLike, Dict[str, Tensor]] = None,
    check: bool = True,
    format: str = protocol.DEFAULT_FORMAT,
    autocast: Optional[torch.dtype] = None,
) -> Path:
    """Export ``model`` with its loss and optimizer as a gradbridge training module at ``path``.

    Args:
        model: the nn.Module to train; its current parameters are the initial state. It is not
            modified: the exported module holds a deep copy.
        loss: a name of ``SUPPORTED_LOSSES``, a spec ``{"name": "cross_entropy",
            "label_smoothing": 0.1, ...}``, or a torch.nn loss module (``nn.CrossEntropyLoss(...)``).
        optimizer: a name of ``SUPPORTED_OPTIMIZERS``, a spec ``{"name": "adam", "lr": 1e-3, ...}``,
            or a fresh torch.optim optimizer over ``model.parameters()`` (one group, no state).
        path: output ``.pt``; written to a temporary file, then renamed: an existing file is never
            left half-written. The file holds CPU tensors whichever device the model is on (a CUDA
            model is exported, and checked, from a CPU copy; the metadata's ``capture`` records
            ``exported_from``), and trains on any device.
        example_inputs: one batch ``(x, y)``. Gives the input specs, is run once through the
            model and loss to check them, and is used to trace the model when it cannot be scripted.
            ``x`` is one tensor, or for a model of several inputs a dict of tensors by name
            (``{"input_ids": ..., "attention_mask": ...}``, passed to forward by keyword) or a tuple
            (named after forward's parameters, in order).
        inputs: the specs of the inputs then ``y`` (``protocol.tensor_spec``) when no example is
            given: ``[x, y]``, or one spec per named input then ``y``.
        model_name: recorded in the metadata; defaults to the model's class name.
        freeze: parameter-name prefixes to freeze (``requires_grad=False``) in the export, as
            well as any parameter already frozen in ``model``. Frozen parameters are exported but
            have no gradient, no optimizer state and never change.
        scheduler: a fresh ``torch.optim.lr_scheduler`` instance over ``optimizer`` (see
            ``schedulers.SUPPORTED``) or a spec ``{"name": "cosine", "T_max": 100}``.
        scheduler_interval: ``"step"`` (after every optimizer step) or ``"epoch"`` (at each epoch's
            end; ReduceLROnPlateau is always per epoch).
        clip_grad_norm, clip_norm_type: ``clip_grad_norm_(params, max_norm, norm_type)`` before
            every step (norm types 2 and inf); clip_grad_value: ``clip_grad_value_`` instead.
        accumulate: gradient accumulation, k micro-batches per optimizer step (see ``train_step``).
        init_weights: a ``state_dict`` (or a file saved with ``torch.save``, read with
            ``weights_only=True``) loaded into the copy of the model before export.
        check: run the written module beside an eager copy of ``model`` and the torch.optim optimizer
            on the example batch (two training steps, then ``evaluate`` and ``forward`` in eval mode)
            and refuse the export at the first bit that differs (``self_check``). On by default; turn
            it off only for a model too large to run twice.
        format: ``"torchscript"`` (protocol 2), ``"export"``: protocol 3, the training step captured
            with torch.export as aten op lists that the native layer runs op by op
            (``export.protocol3_capture``; it takes every option above with SGD, Adam, AdamW, RMSprop or
            Adagrad and a batch of at least 2, except the onecycle schedule; it refuses that and
            parameters the loss gives no gradient in one line), or ``"auto"`` (the default):
            TorchScript where it scripts or traces the model and passes the check, else protocol 3 (a
            warning says so, and the metadata's ``capture`` holds TorchScript's reason under
            ``"auto"``); when neither can, one line gives both reasons. A torch whose
            ``torch.jit.script`` fails takes protocol 3.
        autocast: ``torch.bfloat16`` (or ``torch.float16``): the model's forward and the loss run under
            ``torch.autocast("cpu", dtype=autocast)``, as eager code that wraps them in that region (mixed
            precision without editing the model); recorded as the metadata's ``capture.autocast``. TorchScript
            traces the model and the loss under it (a model that only scripts takes ``format="export"``). A
            dtype CPU autocast does not take is a ValueError.

    Returns the path written.

    Raises:
        ValueError: unknown loss or optimizer, a hyper-parameter out of range, a target dtype that
            does not fit the loss, or missing input specs; raised before anything is written.
        ExportError: the model cannot be scripted and no example_inputs were given to trace it, it is
            already a TorchScript module, or the check found the export differs from the eager model.
    """
    model = model_capture.uncompiled(model)
    model_capture.refuse_captured(model)
    unsupported = model_capture.off_device(model, example_inputs)
    if unsupported:
        raise ExportError(unsupported)
    if format not in protocol.FORMATS:
        raise ValueError(f"format must be one of {', '.join(protocol.FORMATS)}, got {format!r}")
    autocast_dtype = autocast_region.dtype_name(autocast)
    # the file holds CPU tensors: a CUDA model is exported from a CPU copy (the copy below), its example too
    example_inputs = model_capture.on_cpu(example_inputs)
    common = dict(example_inputs=example_inputs, inputs=inputs, model_name=model_name, check=check,
                  exported_from=model_capture.exported_from(model), autocast_dtype=autocast_dtype)
    fine_tuning = dict(freeze=freeze, scheduler=scheduler, clip_grad_norm=clip_grad_norm,
                       clip_grad_value=clip_grad_value, accumulate=accumulate, init_weights=init_weights)
    aten_options = dict(fine_tuning, scheduler_interval=scheduler_interval, clip_norm_type=clip_norm_type)
    check_trail.size_up(model)
    if format == "export":
        return _protocol3(model, loss, optimizer, Path(path), **common, options=aten_options)
    return _torchscript_else_protocol3(model, loss, optimizer, path, format, common, aten_options)


def _torchscript_else_protocol3(model: nn.Module, loss: Any, optimizer: Any, path: Union[str, os.PathLike],
                                format: str, common: Dict[str, Any], options: Dict[str, Any]) -> Path:
    """``format="torchscript"``, or ``"auto"``: TorchScript, and where it cannot capture the model
    (faithfully), protocol 3, once that attempt's tensors are gone (a warning says so; one line when
    neither can). ``options``: the fine-tuning options, as both take them."""
    try:
        return _torchscript(model, loss, optimizer, path, **common, **options)
    except (CaptureError, TorchScriptUnavailableError) as ex:
        if format == "torchscript":
            raise
        reason = str(ex)
    check_trail.release()
    try:
        written = _protocol3(model, loss, optimizer, Path(path), **common, options=options, auto_reason=reason)
    except (ExportError, ValueError) as ex:
        raise ExportError(messages.auto_neither(reason, str(ex))) from ex
    log.warning(messages.auto_took_export(reason))
    return written


def _protocol3(model: nn.Module, loss: Any, optimizer: Any, path: Path, *, example_inputs: Any, inputs: Any,
               model_name: Optional[str], check: bool, options: Dict[str, Any],
               auto_reason: Optional[str] = None, exported_from: Optional[str] = None,
               autocast_dtype: Optional[str] = None) -> Path:
    """Protocol 3 (``export.protocol3_capture``). A model declared by ``inputs`` alone is captured on
    ``example_batch`` of those specs, the batch the TorchScript path checks it on."""
    if example_inputs is None and inputs is not None:
        example_inputs = example_batch(_declared(model, inputs))
    return protocol3_capture.export(model, loss, optimizer, path, example_inputs=example_inputs, model_name=model_name,
                                    check=check, options={**options, "autocast": autocast_dtype},
                                    auto_reason=auto_reason, exported_from=exported_from)


def _declared(model: nn.Module, inputs: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The specs of ``inputs`` (the model's inputs, then ``y``), their names checked against forward's."""
    specs = [dict(spec) for spec in inputs]
    names = [spec.get("name") for spec in specs]
    if len(specs) < 2 or names[-1] != "y":
        raise ValueError(f"inputs must be the specs of the model's inputs then 'y', got {names}")
    model_inputs.check_names(model, names[:-1])
    return specs


def _torchscript(model: nn.Module, loss: Any, optimizer: Any, path: Union[str, os.PathLike], *,
                 example_inputs: Any, inputs: Any, model_name: Optional[str], freeze: Sequence[str], scheduler: Any,
                 scheduler_interval: str, clip_grad_norm: Optional[float], clip_norm_type: float,
                 clip_grad_value: Optional[float], accumulate: int, init_weights: Any, check: bool,
                 exported_from: Optional[str] = None, autocast_dtype: Optional[str] = None) -> Path:
    """Protocol 2: the model scripted (or traced) inside the scripted training module (see
    ``export_training_module``)."""
    loss_module, loss_spec = losses.resolve(loss)

    example_x = None
    if example_inputs is not None:
        if not isinstance(example_inputs, (tuple, list)) or len(example_inputs) != 2:
            raise ValueError(f"example_inputs must be (x, y), got {_count(example_inputs)}")
        if not isinstance(example_inputs[1], Tensor):
            raise ValueError(messages.input_not_tensor("y", type(example_inputs[1]).__name__))
        input_names, example_x = model_inputs.of_example(model, example_inputs[0])
        specs = [protocol.example_spec(n, t) for n, t in model_inputs.arrays(example_x).items()]
        specs.append(protocol.example_spec("y", example_inputs[1]))
    elif inputs is not None:
        specs = _declared(model, inputs)
        input_names = [spec["name"] for spec in specs[:-1]]
    else:
        raise ValueError("pass example_inputs=(x, y) or inputs=[tensor_spec('x', ...), tensor_spec('y', ...)]")
    target_dtype = specs[-1]["dtype"]
    if target_dtype not in loss_module.target_dtypes:
        wanted = messages.alternatives(loss_module.target_dtypes)
        raise ValueError(f"loss {loss_spec['name']} needs a target of dtype {wanted}, "
                         f"got {target_dtype}")

    scripted, metadata, kind = _build(model, loss_module, loss_spec, optimizer, example_inputs, example_x, specs,
                                      input_names, model_name=model_name, check=check, exported_from=exported_from,
                                      init_weights=init_weights, autocast_dtype=autocast_dtype,
                                      finetune_options=dict(
                                          freeze=freeze, scheduler=scheduler, scheduler_interval=scheduler_interval,
                                          clip_grad_norm=clip_grad_norm, clip_norm_type=clip_norm_type,
                                          clip_grad_value=clip_grad_value, accumulate=accumulate))
    path = Path(path)
    with atomic_path(path) as tmp:
        # streamed to the file, not through a buffer the size of the model
        torchscript.save(scripted, str(tmp), _extra_files={protocol.METADATA_FILE: json.dumps(metadata, indent=2)})
        # The scripted module holds the export's copy of the model and its optimizer state (its capture went
        # with _build's frame): let go, so the check holds one side at a time beside the user's model.
        del scripted
        if check:
            check_trail.release()
            x, y = (example_x, example_inputs[1]) if example_inputs is not None else example_batch(specs)
            self_check.check(tmp, model, x, y, kind, init_weights=init_weights)
    log.info("wrote %s", path)
    return path


def _build(model: nn.Module, loss_module: nn.Module, loss_spec: Dict[str, Any], optimizer: Any, example_inputs: Any,
           example_x: Any, specs: List[Dict[str, Any]], input_names: Sequence[str], *, model_name: Optional[str],
           check: bool, exported_from: Optional[str], init_weights: Any, autocast_dtype: Optional[str],
           finetune_options: Dict[str, Any]) -> Tuple[torch.jit.ScriptModule, Dict[str, Any], str]:
    """The training module around a copy of ``model`` (scripted, or traced), scripted; its metadata and the
    capture's kind."""
    names_by_id = {id(p): n for n, p in model.named_parameters()}  # the user's (the optimizer holds those)
    model = model_capture.cpu_copy(model)
    named_parameters = list(model.named_parameters())
    parameters = [p for _, p in named_parameters]
    if not parameters:
        raise ValueError(f"{type(model).__name__} has no parameters: nothing to train; export a model with at least "
                         "one parameter")
    setup = finetune.setup(named_parameters, names_by_id, optimizer, **finetune_options)
    trainable, resolved, optimizer_spec, plan = setup.trainable, setup.resolved, setup.spec, setup.plan
    if init_weights is not None:
        finetune.load_weights(model, init_weights)

    writes = _probe_step(model, loss_module, loss_spec, example_inputs, example_x, specs, model_name)
    # Saved in training mode, the mode Java trains in (a model left in eval mode would keep its
    # dropout off; TorchScript keeps each module's flag).
    model.train()
    if autocast_dtype is not None:  # a trace needs a batch: the example, or the declared specs' one
        example_x, example_y = (example_x, example_inputs[1]) if example_inputs is not None else example_batch(specs)
    captured = model_capture.capture(model, example_x, input_names, autocast_dtype)
    if autocast_dtype is not None:
        output = _eval_output(captured, example_x, input_names)
        loss_module = model_capture.traced_loss(loss_module, output, example_y, autocast_dtype)
    # Tracing copies the module structure but keeps the Parameter objects; take names from the copy.
    named_buffers = captured.named_buffers()
    wrapper_class = _TrainingModule if model_inputs.is_single(input_names) else _SeveralInputs
    wrapper = wrapper_class(
        captured.train, captured.eval, loss_module, setup.optimizers,
        [name for name, _ in named_parameters], parameters,
        [name for name, _ in named_buffers], [b for _, b in named_buffers],
        trainable_index=[i for i, t in enumerate(trainable) if t],
        group_index=[indices for indices, _ in resolved],
        scheduler=plan.scheduler_module, scheduler_interval=plan.interval, lrs=plan.lrs,
        clip=plan.clip, accumulate=plan.accumulate,
    )
    scripted = torchscript.script(wrapper)
    metadata = _metadata(model, scripted, captured, named_parameters, named_buffers, writes, loss_spec=loss_spec,
                         optimizer_spec=optimizer_spec, specs=specs, plan=plan, model_name=model_name, check=check,
                         autocast_dtype=autocast_dtype, exported_from=exported_from)
    return scripted, metadata, captured.kind


def _probe_step(model: nn.Module, loss_module: nn.Module, loss_spec: Dict[str, Any], example_inputs: Any,
                example_x: Any, specs: List[Dict[str, Any]], model_name: Optional[str]) -> Any:
    """What a training step writes (``step_writes.probe``), found by one forward of the example (checked to
    fit the model and loss), else of a batch of the declared specs (checked first: ``_check_specs_fit``)."""
    if example_inputs is not None:
        def fits(output: Any) -> None:
            if not isinstance(output, Tensor):
                raise ExportError(messages.export_output_not_tensor(type(model).__name__, type(output).__name__))
            loss_module(output, example_inputs[1])

        # One forward in training mode checks the example and finds what a step writes; it moves no
        # BatchNorm statistic (the export holds the model's, or the init weights', exactly) and draws
        # nothing from the user's generator (step_writes.probe).
        try:
            writes = step_writes.probe(model, example_x, fits)
        except ExportError:
            raise
        except Exception as ex:
            reason = messages.one_line(ex)
            raise ValueError(f"example_inputs do not fit the model and loss {loss_spec['name']}: {reason}") from ex
    else:
        _check_specs_fit(model, loss_module, loss_spec["name"], specs, model_name or type(model).__name__)
        writes = step_writes.probe(model, example_batch(specs)[0])
    return writes


def _metadata(model: nn.Module, scripted: torch.jit.ScriptModule, captured: model_capture.Capture,
              named_parameters: List[Tuple[str, Tensor]], named_buffers: List[Tuple[str, Tensor]], writes: Any, *,
              loss_spec: Dict[str, Any], optimizer_spec: Dict[str, Any], specs: List[Dict[str, Any]], plan: Any,
              model_name: Optional[str], check: bool, autocast_dtype: Optional[str],
              exported_from: Optional[str]) -> Dict[str, Any]:
    """The scripted module's metadata: its tensors, loss, optimizer and inputs, the fine-tuning plan and how
    the model was captured."""
    persistent = model.state_dict(keep_vars=True)  # torch leaves out register_buffer(..., persistent=False)
    metadata = protocol.build_metadata(
        model=model_name or type(model).__name__,
        parameters=[{**protocol.tensor_spec(n, p.shape, protocol.dtype_name(p.dtype), kind="parameter"),
                     "trainable": p.requires_grad} for n, p in named_parameters],
        buffers=[protocol.buffer_spec(n, b.shape, protocol.dtype_name(b.dtype), n in persistent, n in writes.trained_buffers)
                 for n, b in named_buffers],
        loss=loss_spec,
        optimizer=optimizer_spec,
        inputs=specs,
        torch_version=libtorch.torch_version(),
        gradbridge_version=__version__,
        custom_ops=ops.used_by(scripted),
        weights=weights.record(model),
    )
    if plan.metadata:
        metadata[finetune.METADATA_KEY] = plan.metadata
    metadata[protocol.CAPTURE_KEY] = {"kind": captured.kind, "checked": check,
                                      protocol.DRAWS_RANDOM_KEY: writes.draws_random,
                                      **({protocol.AUTOCAST_KEY: autocast_dtype} if autocast_dtype else {}),
                                      **({protocol.EXPORTED_FROM_KEY: exported_from} if exported_from else {})}
    return metadata


def _eval_output(captured: model_capture.Capture, x: model_inputs.Batch, input_names: Sequence[str]) -> Tensor:
    """The eval-mode trace's output on the example (the loss is traced on it): no gradient, no draw kept."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        return captured.eval(model_inputs.method_argument(x, input_names))


def _count(example: Any) -> str:
    return f"{len(example)} items" if isinstance(example, (tuple, list)) else type(example).__name__


def example_batch(specs: Sequence[Dict[str, Any]]) -> Tuple[model_inputs.Batch, Tensor]:
    """A batch of two for the declared specs (the inputs, then y): floats drawn from a generator of its
    own (torch's is left alone), integers zero (a valid index and class)."""
    generator = torch.Generator().manual_seed(0)
    batch = {}
    for spec in specs:
        shape, dtype = [2 if d == -1 else d for d in spec["shape"]], getattr(torch, spec["dtype"])
        batch[spec["name"]] = (torch.randn(shape, generator=generator, dtype=dtype) if dtype.is_floating_point
                               else torch.zeros(shape, dtype=dtype))
    y = batch.pop("y")
    return (batch["x"] if model_inputs.is_single(list(batch)) else batch), y


def _check_specs_fit(model: nn.Module, loss_module: nn.Module, loss_name: str, specs: Sequence[Dict[str, Any]],
                     name: str) -> None:
    """Run a zero batch of the declared shapes through a throwaway copy (eval mode, no grad), so
    a module that could never take a step is refused at export, not on its first step."""
    batch = {spec["name"]: torch.zeros([2 if d == -1 else d for d in spec["shape"]], dtype=getattr(torch, spec["dtype"]))
             for spec in specs}
    y = batch.pop("y")
    try:
        with torch.no_grad():
            loss_module(model_inputs.call(copy.deepcopy(model).eval(),
                                          batch["x"] if model_inputs.is_single(list(batch)) else batch), y)
    except Exception as ex:  # torch raises RuntimeError, IndexError, ValueError...
        reason = messages.one_line(ex)
        described = ", ".join(f"{s['name']} {s['shape']} {s['dtype']}" for s in specs)
        raise ValueError(f"inputs {described} do not fit model {name} with loss {loss_name}: {reason}") from ex


#: Built-in models' default loss and input specs, for `gradbridge export NAME`.
BUILTIN_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "linear-regression": {"loss": "mse", "x": ([-1, 1], "float32"), "y": ([-1, 1], "float32")},
}


def export_builtin(name: str, path: Union[str, os.PathLike], *, seed: int = 0, lr: float = SEED_LR,
                   optimizer: Optional[Dict[str, Any]] = None, loss: Optional[Dict[str, Any]] = None,
                   inputs: Optional[Sequence[Dict[str, Any]]] = None, fine_tuning: Optional[Dict[str, Any]] = None,
                   **model_options: Any) -> Path:
    """Export a model of ``models.BUILTIN_MODELS`` with initial parameters drawn under ``seed``.

    The linear regression defaults to MSE, SGD with ``lr`` and x, y of shape [-1, 1]; other
    built-ins need ``loss`` and ``inputs``. ``optimizer`` defaults to ``{"name": "sgd", "lr": lr}``.
    ``fine_tuning``: keyword arguments of ``export_training_module`` (freeze, scheduler, ...).
    """
    if name not in BUILTIN_MODELS:
        raise ValueError(f"Unknown built-in model {name!r}; known: {', '.join(BUILTIN_MODELS)}")
    defaults = BUILTIN_DEFAULTS.get(name, {})
    if inputs is None and defaults:
        inputs = [protocol.tensor_spec("x", *defaults["x"]), protocol.tensor_spec("y", *defaults["y"])]
    loss = loss or ({"name": defaults["loss"]} if defaults else None)
    if loss is None or inputs is None:
        raise ValueError(f"built-in model {name!r} needs a loss and input specs")
    optimizer = optimizer or {"name": "sgd", "lr": lr}
    # Validate before drawing parameters so bad options never touch torch's RNG or the file.
    losses.build(loss)
    optim.build({k: v for k, v in optimizer.items() if k != "groups"}, [])
    torch.manual_seed(seed)
    model = BUILTIN_MODELS[name](**model_options)
    return export_training_module(model, loss, optimizer, path, inputs=inputs, model_name=name, **(fine_tuning or {}))
