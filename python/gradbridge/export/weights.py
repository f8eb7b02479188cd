"""Fine-tuned weights back where they came from: the user's model, or PEFT's adapter folder.

``state_dict_of`` reads the model's ``state_dict`` out of an exported module or a Java checkpoint (either
format; a checkpoint holds the trained values) under the keys of the model's own ``state_dict()``.
``save_state_dict`` writes it with torch.save or as safetensors, by the output's suffix (``FORMATS``) or
``format``; ``save_adapter`` writes a PEFT model's adapter alone as ``PeftModel.save_pretrained`` does
(``adapter_model.safetensors`` and ``adapter_config.json``, so ``PeftModel.from_pretrained(base, DIR)``
loads it); ``write`` does both, reading the module once (``gradbridge state-dict``).

``record`` makes, at export, the metadata entry they read (``protocol.WEIGHTS_KEY``): the state_dict keys
that hold a tensor listed under another name (tied embeddings: a protocol-3 module holds each tensor once),
and for a model holding a ``peft.PeftModel`` what its ``save_pretrained`` writes of the exported model: each
adapter's ``adapter_config.json`` and which state_dict key each tensor of its ``adapter_model.safetensors`` is.
"""

from __future__ import annotations

import itertools
import math
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch
from torch import Tensor, nn

from .. import messages, protocol
from .._runtime import inputs, torchscript
from .._runtime.files import atomic_path, check_writable
from .._runtime.program import read_program
from ..errors import FineTuneError, ProtocolError
from .capture import KEYWORD_PREFIX

log = logging.getLogger(__name__)

#: The output formats of ``save_state_dict`` and the suffixes that choose each.
FORMATS: Dict[str, tuple] = {"safetensors": (".safetensors",), "torch": (".pt", ".pth", ".bin")}
#: PEFT's file names (``peft.utils.SAFETENSORS_WEIGHTS_NAME``, ``CONFIG_NAME``) and the adapter it saves at the
#: folder's root (others go to a subfolder of their name).
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ROOT_ADAPTER = "default"
#: The header metadata transformers and PEFT write (transformers' from_pretrained refuses a file without it).
SAFETENSORS_METADATA = {"format": "pt"}

PathLike = Union[str, os.PathLike]


# ---- at export ----

def record(model: nn.Module) -> Dict[str, Any]:
    """The ``protocol.WEIGHTS_KEY`` entry of the model being exported (the export's own copy: PEFT's
    ``save_pretrained`` runs on it); empty when there is nothing to record."""
    entry: Dict[str, Any] = {}
    tied = _tied(model)
    if tied:
        entry[protocol.WEIGHTS_TIED] = tied
    adapters = _peft(model)
    if adapters:
        entry[protocol.WEIGHTS_PEFT] = adapters
    return entry


def _tied(model: nn.Module) -> Dict[str, str]:
    """State_dict keys whose tensor the model lists (named_parameters, named_buffers) under another name."""
    names: Dict[int, str] = {}
    for name, tensor in itertools.chain(model.named_parameters(), model.named_buffers()):
        names.setdefault(id(tensor), name)
    listed = set(names.values())
    return {key: names[id(value)] for key, value in model.state_dict(keep_vars=True).items()
            if key not in listed and id(value) in names}


def _peft(model: nn.Module) -> Optional[Dict[str, Any]]:
    """The ``peft`` part of the entry, or None: no PeftModel (peft not even imported), or one PEFT cannot save."""
    peft = sys.modules.get("peft")
    if peft is None:
        return None
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, peft.PeftModel)]
    if len(found) != 1:
        if found:
            log.warning(messages.weights_not_recorded(f"the model holds {len(found)} PEFT models "
                                                      f"({', '.join(name or '(the model)' for name, _ in found)})"))
        return None
    name, peft_model = found[0]
    prefix = f"{name}." if name else ""
    try:
        with warnings.catch_warnings():  # PEFT's notes on saving (the vocabulary, the model card): not the user's
            warnings.simplefilter("ignore")
            return {"prefix": prefix, "adapters": _adapters(peft_model, prefix)}
    except Exception as ex:  # an adapter kind PEFT saves otherwise: the export goes on without it
        log.warning(messages.weights_not_recorded(messages.one_line(ex)))
        return None


def _adapters(peft_model: nn.Module, prefix: str) -> Dict[str, Any]:
    """Each adapter's config and keys, as PEFT's own ``save_pretrained`` writes them: its config file is
    read back, and ``get_peft_model_state_dict`` (the call it saves with) over the model's state_dict tells
    which tensor each key of its weights file is."""
    from peft.utils import get_peft_model_state_dict
    from safetensors import safe_open

    own = peft_model.state_dict()
    keys_of = {id(value): prefix + key for key, value in own.items()}
    adapters: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gradbridge-adapter-") as folder:
        peft_model.save_pretrained(folder)
        for adapter in peft_model.peft_config:
            where = Path(folder) / _subfolder(adapter)
            picked = get_peft_model_state_dict(peft_model, state_dict=own, adapter_name=adapter)
            strange = [key for key, value in picked.items() if id(value) not in keys_of]
            if strange:
                raise ValueError(f"adapter '{adapter}': PEFT saves {strange[0]} as a tensor it computes, not one of "
                                 "the model's")
            keys = {key: keys_of[id(value)] for key, value in picked.items()}
            with safe_open(str(where / ADAPTER_WEIGHTS), "pt") as written:
                if set(written.keys()) != set(keys):
                    raise ValueError(f"adapter '{adapter}': PEFT's {ADAPTER_WEIGHTS} holds other keys than "
                                     "get_peft_model_state_dict gives")
            # its text as PEFT wrote it: JSON parsed again (Java's Gson drops null members when it writes a
            # checkpoint's metadata) would not be the same file
            adapters[adapter] = {"config": (where / ADAPTER_CONFIG).read_text(encoding="utf-8"), "keys": keys}
    return adapters


def _subfolder(adapter: str) -> str:
    return "" if adapter == ROOT_ADAPTER else adapter


# ---- from a module or a checkpoint ----

def state_dict_of(module_path: PathLike, base: Optional[PathLike] = None) -> Dict[str, Tensor]:
    """The model's state_dict inside an exported module or a Java checkpoint (its current values: a
    checkpoint holds the trained ones), for ``model.load_state_dict``: the keys of the model's own
    ``state_dict()`` (tied ones included), each tensor its own copy of the dtype it trained in, without the
    buffers registered with ``persistent=False`` (a TorchScript module does not keep that flag; the
    metadata does). An online learner's checkpoint (``checkpoint-vNNNNNNNN.trained.pt``) leaves out what
    training never changes (frozen parameters, constant buffers: zero elements there): ``base``, the module
    file it learned from, gives those; without it such a checkpoint is refused, naming it."""
    path = Path(module_path)
    metadata = protocol.read_metadata(path)  # identifies the file before torch reads it
    return _filled(path, metadata, _state_dict(path, metadata, _entry(path, metadata)), base)


def _declared_shape(metadata: Dict[str, Any], name: str) -> List[int]:
    """The shape the metadata declares for a parameter or buffer."""
    return next(list(spec["shape"]) for spec in metadata["parameters"] + metadata["buffers"] if spec["name"] == name)


def _filled(path: Path, metadata: Dict[str, Any], state: Dict[str, Tensor], base: Optional[PathLike]) -> Dict[str, Tensor]:
    """``state`` with the tensors an online checkpoint leaves out (zero elements where the metadata declares
    more) taken from ``base``; one line when they are left out and no base, or another base, is given."""
    left_out = [spec["name"] for spec in metadata["parameters"] + metadata["buffers"]
                if spec["name"] in state and state[spec["name"]].numel() == 0 and math.prod(spec["shape"]) != 0]
    if not left_out:
        return state
    if base is None:
        raise FineTuneError(messages.weights_left_out(str(path), len(left_out), left_out[0]))
    whole = state_dict_of(base)
    for name in left_out:
        shape = _declared_shape(metadata, name)
        if name not in whole or list(whole[name].shape) != shape:
            raise FineTuneError(messages.weights_other_base(str(base), name, shape, str(path)))
        state[name] = whole[name]
    return state


def _state_dict(path: Path, metadata: Dict[str, Any], entry: Dict[str, Any]) -> Dict[str, Tensor]:
    transient = {spec["name"] for spec in metadata["buffers"] if not spec.get("persistent", True)}
    if metadata["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION:
        _, _, program_state = read_program(path)  # its own tensors, checked against the metadata
        state = {name.split(":", 1)[1]: tensor for name, tensor in program_state.items()
                 if name.split(":", 1)[0] in ("param", "buffer")}
    else:
        try:
            model = torchscript.load(str(path), map_location="cpu").model
        except (RuntimeError, AttributeError) as ex:
            raise FineTuneError(f"{path}: not a loadable gradbridge module: {messages.one_line(ex)}") from ex
        # a model of several inputs sits inside the keyword call (export.capture), under its prefix
        prefix = "" if inputs.is_single(inputs.names(metadata)) else KEYWORD_PREFIX
        state = {key[len(prefix):]: value.detach().clone() for key, value in model.state_dict().items()
                 if key.startswith(prefix)}
    for key, name in entry.get(protocol.WEIGHTS_TIED, {}).items():
        if key not in state and name in state:
            state[key] = state[name].clone()  # its own tensor: safetensors holds no aliases
    return {key: value for key, value in state.items() if key not in transient}


def _entry(path: Path, metadata: Dict[str, Any]) -> Dict[str, Any]:
    """The metadata's ``WEIGHTS_KEY`` entry (empty when absent), its shape checked: one line naming the key."""
    entry = metadata.get(protocol.WEIGHTS_KEY, {})

    def refuse(key: str, expected: str, value: Any) -> ProtocolError:
        return ProtocolError(messages.metadata_key(str(path), key, expected, messages.json_text(value)))

    def strings(value: Any) -> bool:
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())

    if not isinstance(entry, dict):
        raise refuse(protocol.WEIGHTS_KEY, "an object", entry)
    where = f"{protocol.WEIGHTS_KEY}.{protocol.WEIGHTS_TIED}"
    if not strings(entry.get(protocol.WEIGHTS_TIED, {})):
        raise refuse(where, "an object of names", entry[protocol.WEIGHTS_TIED])
    adapters = entry.get(protocol.WEIGHTS_PEFT)
    where = f"{protocol.WEIGHTS_KEY}.{protocol.WEIGHTS_PEFT}"
    if adapters is not None:
        if not (isinstance(adapters, dict) and isinstance(adapters.get("prefix"), str)
                and isinstance(adapters.get("adapters"), dict) and adapters["adapters"]):
            raise refuse(where, 'an object with "prefix" and "adapters"', adapters)
        for name, adapter in adapters["adapters"].items():
            if not (isinstance(adapter, dict) and isinstance(adapter.get("config"), str)
                    and strings(adapter.get("keys"))):
                raise refuse(f"{where}.adapters.{name}", 'an object with "config" (text) and "keys"', adapter)
    return entry


# ---- files ----

def format_of(output: PathLike, format: Optional[str] = None) -> str:
    """``format`` (checked), else the one ``output``'s suffix names (``FORMATS``)."""
    if format is not None:
        if format not in FORMATS:
            raise FineTuneError(messages.weights_format(format, list(FORMATS)))
        return format
    suffix = Path(output).suffix
    for name, suffixes in FORMATS.items():
        if suffix.lower() in suffixes:
            return name
    known = " or ".join(f"{', '.join(suffixes)} ({name})" for name, suffixes in FORMATS.items())
    raise FineTuneError(messages.weights_suffix(str(output), suffix, known))


def save_state_dict(module_path: PathLike, out: PathLike, format: Optional[str] = None,
                    base: Optional[PathLike] = None) -> Path:
    """Write ``state_dict_of(module_path, base)``: safetensors (``safetensors.torch.load_file`` reads it) or
    torch.save (``torch.load(..., weights_only=True)``), by ``out``'s suffix or ``format``."""
    return write(module_path, out, format=format, base=base)[0]


def save_adapter(module_path: PathLike, folder: PathLike) -> List[Path]:
    """Write the PEFT adapter(s) of ``module_path``'s model into ``folder`` as ``PeftModel.save_pretrained``
    does: ``PeftModel.from_pretrained(base, folder)`` loads the trained adapter. Returns each adapter's folder."""
    return write(module_path, adapter=folder)


def write(module_path: PathLike, output: Optional[PathLike] = None, *, format: Optional[str] = None,
          adapter: Optional[PathLike] = None, base: Optional[PathLike] = None) -> List[Path]:
    """The state_dict to ``output`` and the adapter to the folder ``adapter``, the module read once; every
    refusal (format, unwritable outputs, no adapter) before it is read; ``base`` as for ``state_dict_of``.
    Returns the paths written."""
    if output is None and adapter is None:
        raise FineTuneError(messages.weights_nothing_asked())
    chosen = None
    if output is not None:
        chosen = format_of(output, format)
        check_writable(output)
    if adapter is not None:
        check_writable(Path(adapter) / ADAPTER_CONFIG)
    path = Path(module_path)
    metadata = protocol.read_metadata(path)
    entry = _entry(path, metadata)
    if adapter is not None and protocol.WEIGHTS_PEFT not in entry:
        raise FineTuneError(messages.weights_no_adapter(str(path)))
    state = _state_dict(path, metadata, entry)
    written = []
    if output is not None:
        state = _filled(path, metadata, state, base)
        with atomic_path(output) as tmp:
            _save(state, tmp, chosen)
        written.append(Path(output))
    if adapter is not None:
        for name, spec in entry[protocol.WEIGHTS_PEFT]["adapters"].items():
            missing = [key for key in spec["keys"].values() if key not in state]
            if missing:
                raise ProtocolError(messages.weights_adapter_key(str(path), name, missing[0]))
            where = Path(adapter) / _subfolder(name)
            with atomic_path(where / ADAPTER_WEIGHTS) as tmp:
                _save({key: state[source] for key, source in spec["keys"].items()}, tmp, "safetensors")
            with atomic_path(where / ADAPTER_CONFIG) as tmp:
                tmp.write_text(spec["config"], encoding="utf-8")
            written.append(where)
    return written


def _save(state: Dict[str, Tensor], file: Path, format: str) -> None:
    if format == "safetensors":
        from safetensors.torch import save_file

        tensors, storages = {}, set()
        for key, value in state.items():  # safetensors holds no aliases: a tensor under two keys is copied
            value = value.contiguous()
            if value.untyped_storage().data_ptr() in storages and value.numel():
                value = value.clone()
            storages.add(value.untyped_storage().data_ptr())
            tensors[key] = value
        save_file(tensors, str(file), metadata=SAFETENSORS_METADATA)
    else:
        torch.save(state, str(file))
