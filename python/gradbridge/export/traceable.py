"""What protocol 3's capture changes while torch.export traces a model, and how it names why a capture failed.

``while_capturing`` replaces, for the duration of a capture only, library code that computes the same values
in a way torch.export cannot trace:

- transformers' attention masks (``masking_utils._vmap_for_bhqkv``) are built with ``torch.vmap`` over the
  batch, head, query and key indices. torch 2.7's non-strict export cannot trace ``vmap`` (it queries a
  batched tensor's contiguity in channels-last formats, then meets ``TransformGetItemToIndex``'s
  autograd.Function under ``vmap``). The same mask function called once on index tensors shaped to broadcast
  (``[B,1,1,1]``, ``[1,H,1,1]``, ``[1,1,Q,1]``, ``[1,1,1,KV]``) gives the same booleans; the export's bitwise
  check against the user's eager model (which keeps ``vmap``) holds the capture to that.

- eager runs an aten op's C++ kernels; a trace may take another route to the same op. It runs an op's
  Python decomposition where torch registered one for tracing (``py_kernels[CompositeImplicitAutograd]``:
  ``dropout`` becomes ``native_dropout``, which scales by ``1 / (1 - p)`` in double where eager divides in
  float, so the masks' outputs differ for p = 0.04, 0.09, 0.15, ...), and it decomposes an op that has both
  a CPU kernel and a composite one (``silu_backward``, ``mish_backward``: eager runs the fused CPU kernel,
  the trace ``sigmoid``, ``sub``, ``mul``...). While capturing, those Python decompositions are set aside
  (the C++ composite runs, as in eager) and those ops stay whole in the graph (``eager_kernels``).

- eager evaluates a ``TransformerEncoderLayer`` under ``no_grad`` with its native
  ``_transformer_encoder_layer_fwd``; the layer's fast-path test asks ``has_torch_function``, which
  torch.export's own torch-function mode makes true, so while capturing it asks the arguments only (a tensor
  subclass still says no), and the kernel gets a shape function for fake tensors where torch has none.
  ``nn.MultiheadAttention`` in eval mode under ``no_grad`` runs its native ``_native_multi_head_attention``
  in eager; its fast-path test asks the same ``has_torch_function`` and, on newer torches,
  ``_is_make_fx_tracing`` (true while torch.export traces): while capturing that says no, so the eval graphs
  run eager's kernel.

- oneDNN's LSTM/GRU/RNN backward (``mkldnn_rnn_layer_backward``, the kernel eager's CPU recurrent layers
  run) returns one tensor as the gradient of both biases; aot_autograd's signature names gradients by the
  graph node that outputs them and asserts one name per parameter. A result output twice is output the
  second time as a ``clone`` (eager's ``AccumulateGrad`` clones it too: the values are the same, the two
  gradients no longer share memory, so accumulating one leaves the other alone).

It also records the custom ``torch.autograd.Function``s the model applies to tensors that need gradients
(non-strict torch.export keeps their forward and drops their backward: the capture refuses them), keeps
torch's logs and partial graphs of a failed capture off stderr, and removes the module-buffer hook a failed
capture leaves registered in torch (torch 2.7-2.15; it would hold the traced model for the process's life).

``share_tied`` reads a tensor the model ties under several names (shared embeddings) under one.

``capture_failure`` turns torch's multi-line error into the reason and the first place in the model's code.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch

from .. import messages

_TORCH = str(Path(torch.__file__).resolve().parent)
_GRADBRIDGE = str(Path(__file__).resolve().parents[1])


def _broadcast_bhqkv(mask_function: Callable, bh_indices: bool = True) -> Callable:
    """``_vmap_for_bhqkv``'s result by broadcasting: one call of ``mask_function`` on index tensors."""

    def mask(batch_idx: Any, head_idx: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        if not bh_indices:
            return mask_function(batch_idx, head_idx, q_idx[:, None], kv_idx[None, :]).expand(len(q_idx), len(kv_idx))
        shape = (len(batch_idx), len(head_idx), len(q_idx), len(kv_idx))
        return mask_function(batch_idx[:, None, None, None], head_idx[None, :, None, None],
                             q_idx[None, None, :, None], kv_idx[None, None, None, :]).expand(shape)

    return mask


def _not_decomposed(*args: Any, **kwargs: Any) -> Any:
    return NotImplemented  # OpOverload.decompose's answer for an op traced whole


def eager_kernels() -> Tuple[List[Any], List[Any]]:
    """(ops whose Python decomposition a trace would run instead of eager's C++ composite, ops with both a CPU
    kernel and a C++ composite, which a trace would decompose), among this torch's aten operators."""
    import torch._decomp  # noqa: F401  (registers torch's Python decompositions, as torch.export does)

    cia = torch._C.DispatchKey.CompositeImplicitAutograd
    # an op's Python kernels hang on its OpOverload, which exists once its packet was looked up
    python = [op for packet in list(vars(torch.ops.aten).values()) if isinstance(packet, torch._ops.OpOverloadPacket)
              for op in list(vars(packet).values()) if isinstance(op, torch._ops.OpOverload) and cia in op.py_kernels]
    whole = []
    for schema in torch._C._jit_get_all_schemas():
        qualified = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        if not schema.name.startswith("aten::"):
            continue
        try:
            both = (torch._C._dispatch_has_kernel_for_dispatch_key(qualified, cia)
                    and torch._C._dispatch_has_kernel_for_dispatch_key(qualified, torch._C.DispatchKey.CPU))
        except RuntimeError:  # an operator of TorchScript's own (aten::Bool, ...), not the dispatcher's
            continue
        if both:
            packet = getattr(torch.ops.aten, schema.name[len("aten::"):])
            whole.append(getattr(packet, schema.overload_name or "default"))
    return python, whole


def _set_cia(op: Any, kernel: Any) -> None:
    cia = torch._C.DispatchKey.CompositeImplicitAutograd
    if kernel is None:
        op.py_kernels.pop(cia, None)
    else:
        op.py_kernels[cia] = kernel
    op._dispatch_cache.clear()


def _differentiated(args: Any) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


_has_torch_function = torch.overrides.has_torch_function


def _subclass_torch_function(args: Any) -> bool:
    """``has_torch_function`` of the arguments themselves (a tensor subclass), not of the active modes."""
    return any(isinstance(a, torch.Tensor) and type(a) not in (torch.Tensor, torch.nn.Parameter)
               and type(a).__torch_function__ is not torch._C._disabled_torch_function_impl for a in args)


def _distinct_outputs(create: Callable) -> Callable:
    """aot_autograd's ``create_graph_signature``, called on a graph whose outputs are distinct nodes: a node
    output again is output as its ``clone``."""

    def signature(fx_g: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        output = next(n for n in reversed(fx_g.graph.nodes) if n.op == "output")
        results, seen = list(output.args[0]), set()
        for i, value in enumerate(results):
            if isinstance(value, torch.fx.Node) and value in seen:
                with fx_g.graph.inserting_before(output):
                    results[i] = fx_g.graph.call_function(torch.ops.aten.clone.default, (value,))
            seen.add(value)
        output.args = (tuple(results),)
        fx_g.recompile()
        return create(fx_g, *args, **kwargs)

    return signature


def _not_tracing() -> bool:
    return False  # nn.MultiheadAttention's fast-path test, as eager answers it


def _encoder_layer_shape(src: torch.Tensor, *args: Any) -> torch.Tensor:
    return torch.empty_like(src, memory_format=torch.contiguous_format)


@contextlib.contextmanager
def while_capturing() -> Iterator[List[str]]:
    """The replacements of this module's docstring, for the libraries this process has imported. Yields the
    names of the custom ``torch.autograd.Function``s the model applied to tensors that need gradients:
    non-strict torch.export keeps such a function's forward ops and drops its own backward."""
    masks = sys.modules.get("transformers.masking_utils")
    applied: List[str] = []
    apply = torch.autograd.Function.__dict__["apply"]

    def recording(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if _differentiated(itertools.chain(args, kwargs.values())):
            applied.append(cls.__name__)
        return apply.__get__(None, cls)(*args, **kwargs)  # a classmethod (C-implemented on newer torches)

    python, whole = eager_kernels()
    cia = torch._C.DispatchKey.CompositeImplicitAutograd
    with contextlib.ExitStack() as stack:
        # torch logs a failed capture's guards and prints its partial graph on stderr, many lines; the export's
        # one-line refusal says why (``capture_failure``)
        stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
        for logger in [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
                       if name == "torch" or name.startswith("torch.")]:
            stack.callback(setattr, logger, "disabled", logger.disabled)
            logger.disabled = True
        for op in python:
            stack.callback(_set_cia, op, op.py_kernels[cia])
            _set_cia(op, None)
        for op in whole:
            stack.callback(_set_cia, op, None)
            _set_cia(op, _not_decomposed)
        if masks is not None and hasattr(masks, "_vmap_for_bhqkv"):
            original = masks._vmap_for_bhqkv
            masks._vmap_for_bhqkv = _broadcast_bhqkv
            stack.callback(setattr, masks, "_vmap_for_bhqkv", original)
        # eager evaluates a TransformerEncoderLayer and a MultiheadAttention under no_grad with their native
        # kernels; the trace takes them too: their fast-path tests ask has_torch_function, which torch.export's
        # own torch-function mode turns true (the attention also whether make_fx or torch.export traces), and
        # the layer's kernel has no shape function for fake tensors
        torch.overrides.has_torch_function = _subclass_torch_function
        stack.callback(setattr, torch.overrides, "has_torch_function", _has_torch_function)
        attention = sys.modules["torch.nn.modules.activation"]
        stack.callback(setattr, attention, "_is_make_fx_tracing", attention._is_make_fx_tracing)
        attention._is_make_fx_tracing = _not_tracing
        if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_transformer_encoder_layer_fwd", "Meta"):
            shapes = torch.library.Library("aten", "IMPL")
            stack.callback(shapes._destroy)
            shapes.impl("_transformer_encoder_layer_fwd", _encoder_layer_shape, "Meta")
        from torch._functorch import aot_autograd as aot
        stack.callback(setattr, aot, "create_graph_signature", aot.create_graph_signature)
        aot.create_graph_signature = _distinct_outputs(aot.create_graph_signature)
        torch.autograd.Function.apply = classmethod(recording)
        stack.callback(setattr, torch.autograd.Function, "apply", apply)
        # a capture that fails leaves torch's buffer-assignment hook registered for good, and with it the module
        # traced (the export's copy of the model): the hooks it added go when it ends
        hooks = torch.nn.modules.module._global_buffer_registration_hooks
        stack.callback(_forget_hooks, hooks, set(hooks))
        yield applied


def _forget_hooks(hooks: Dict[int, Any], before: Set[int]) -> None:
    for key in [key for key in hooks if key not in before]:
        del hooks[key]


def share_tied(gm: torch.fx.GraphModule, names: Set[str]) -> torch.fx.GraphModule:
    """``gm`` (torch.export's module) reading each tied tensor under one name. A tensor under several names
    (HF ties embeddings: T5's ``shared`` and ``encoder.embed_tokens``) is one parameter to eager autograd, whose
    gradient sums every use; ``aot_export_module`` would take each name as an input of its own and refuse the
    names that then get no gradient. The name kept is the model's own (``names``: ``named_parameters()`` and
    ``named_buffers()``, deduplicated as torch does)."""
    groups: Dict[int, List[str]] = {}
    for name, tensor in itertools.chain(gm.named_parameters(remove_duplicate=False),
                                        gm.named_buffers(remove_duplicate=False)):
        groups.setdefault(id(tensor), []).append(name)
    rename = {}
    for group in groups.values():
        keep = next((n for n in group if n in names), group[0])
        rename.update({n: keep for n in group if n != keep})
    if not rename:
        return gm
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target in rename:
            node.target = rename[node.target]
    for name in rename:
        owner, _, attribute = name.rpartition(".")
        delattr(gm.get_submodule(owner) if owner else gm, attribute)
    gm.recompile()
    return gm


def _model_frame(ex: BaseException) -> Optional[str]:
    """The innermost frame of the traceback in the model's code (not torch's, not gradbridge's)."""
    found = None
    for frame in traceback.extract_tb(ex.__traceback__):
        if not frame.filename.startswith("<") and not str(Path(frame.filename).resolve()).startswith((_TORCH,
                                                                                                      _GRADBRIDGE)):
            found = frame
    if found is None:
        return None
    code = found.line.split("  #")[0].strip() if found.line else ""
    return f"{_short_path(found.filename)}:{found.lineno}" + (f" `{code}`" if code else "")


def _short_path(filename: str) -> str:
    parts = Path(filename).parts
    return "/".join(parts[parts.index("site-packages") + 1:]) if "site-packages" in parts else filename


#: fake tensors' exceptions for an operator whose output size (or value) depends on its input's values
#: (torch.unique_consecutive, nonzero, item): their text is only the operator's name
_DATA_DEPENDENT_OUTPUT = ("DynamicOutputShapeException", "DataDependentOutputException")


def _sized_by_data(ex: Optional[BaseException]) -> bool:
    seen = 0
    while ex is not None and seen < 32:
        if type(ex).__name__ in _DATA_DEPENDENT_OUTPUT:
            return True
        ex, seen = ex.__cause__ or ex.__context__, seen + 1
    return False


def capture_failure(ex: BaseException) -> str:
    """Why torch.export failed, in one line: a data-dependent branch or size named as such, else torch's
    first line; with the model's code where it happened."""
    text = str(ex)
    where = _model_frame(ex)
    at = f" at {where}" if where else ""
    if "data-dependent" in text or _sized_by_data(ex):  # torch's GuardOnDataDependentSymNode and kin
        return messages.aten_data_dependent(at)
    first = next((line.strip() for line in text.splitlines() if line.strip()), None)
    if first is None:  # a bare `assert` inside torch: where it failed is all there is to say
        frames = traceback.extract_tb(ex.__traceback__)
        inner = f" in {_short_path(frames[-1].filename)}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""
        first = f"{type(ex).__name__}{inner}"
    return f"{first[:300]}{at}"
