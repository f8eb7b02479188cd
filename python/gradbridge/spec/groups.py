"""Parameter groups and frozen parameters: which parameters train, with which options.

An optimizer spec may carry ``"groups"``: a list of ``{"params": [names]}`` (from a torch.optim
instance, or written into the metadata) or ``{"prefix": "backbone."}`` (the CLI's ``--group``),
each with its own options (lr, weight_decay, momentum, betas, eps, ...) over the spec's
top-level defaults, as torch.optim's ``param_groups`` do. Prefix groups leave the other
trainable parameters in a default group that comes first. Frozen parameters
(``requires_grad=False``) belong to no group: no gradient, no optimizer state, never updated; a
torch.optim instance that holds them in a group (``AdamW(model.parameters())``) is exported without
them, which is what torch.optim's step does with them.

Every refusal is one line naming the parameter, group or option (``GroupError``), raised before
anything is written.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from ..errors import GradbridgeError, GroupError  # GroupError: also importable from here, as before
from . import optim
from .options import tensor_refused


def _hyper_keys(name: str) -> List[str]:
    return list(optim.OPTIMIZERS[name]([]).hyperparameters())


def _plain(value: Any, where: str, key: str) -> Any:
    if torch.is_tensor(value) or (isinstance(value, tuple) and any(torch.is_tensor(v) for v in value)):
        raise GroupError(tensor_refused(where, key, value))
    return list(value) if isinstance(value, tuple) else value


def spec_of_instance(optimizer: torch.optim.Optimizer, names_by_id: Dict[int, str],
                     trainable: Dict[str, bool]) -> Dict[str, Any]:
    """The spec of a fresh torch.optim instance: one group -> ``optim.spec_of``; more -> ``groups``.

    Refuses parameters the model does not have. A frozen parameter (requires_grad=False) in a group,
    as ``AdamW(model.parameters())`` on a PEFT model holds its base, is left out of the spec's group:
    torch.optim never gives it a gradient, so it never steps it and creates no state for it (the
    same for every optimizer but Adagrad, whose constructor fills a ``sum`` that no step reads).
    """
    for index, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            name = names_by_id.get(id(p))
            if name is None:
                raise GroupError(f"parameter group {index} holds a tensor of shape {list(p.shape)} "
                                 "that is not a parameter of the model")
    if len(optimizer.param_groups) == 1:
        spec = optim.spec_of(optimizer)
        names = [n for n in (names_by_id[id(p)] for p in optimizer.param_groups[0]["params"]) if trainable[n]]
        if names != [n for n in names_by_id.values() if trainable[n]]:
            spec["groups"] = [{"params": names, **{k: v for k, v in spec.items() if k != "name"}}]
        return spec
    by_torch_name = {cls.torch_name: name for name, cls in optim.OPTIMIZERS.items()}
    torch_name = type(optimizer).__name__
    if torch_name not in by_torch_name:
        raise ValueError(f"Unknown optimizer {torch_name}; supported: {', '.join(by_torch_name)}")
    # Adagrad fills its state (step 0, sum) at construction; any other state means it stepped.
    if any(state and float(state.get("step", 1)) != 0 for state in optimizer.state.values()):
        raise GradbridgeError(f"{torch_name} has already stepped; export a fresh optimizer")
    name = by_torch_name[torch_name]
    for index, group in enumerate(optimizer.param_groups):
        optim.check_torch_group(torch_name, group, f"{torch_name} parameter group {index}")
    keys = _hyper_keys(name)
    spec: Dict[str, Any] = {"name": name, **{k: _plain(optimizer.defaults[k], torch_name, k)
                                             for k in keys if k in optimizer.defaults}}
    spec["groups"] = [{"params": [names_by_id[id(p)] for p in group["params"] if trainable[names_by_id[id(p)]]],
                       **{k: _plain(group[k], f"{torch_name} parameter group {index}", k) for k in keys}}
                      for index, group in enumerate(optimizer.param_groups)]
    return spec


def resolve(spec: Dict[str, Any], names: Sequence[str], trainable: Sequence[bool]
            ) -> List[Tuple[List[int], Dict[str, Any]]]:
    """The groups as (parameter indices, options without name) for the spec over the model."""
    defaults = {k: v for k, v in spec.items() if k not in ("name", "groups")}
    trainable_indices = [i for i, t in enumerate(trainable) if t]
    if "groups" not in spec:
        return [(trainable_indices, defaults)]
    index_of = {n: i for i, n in enumerate(names)}
    taken: Dict[int, int] = {}
    groups: List[Tuple[List[int], Dict[str, Any]]] = []
    explicit = False
    for number, group in enumerate(spec["groups"]):
        options = {**defaults, **{k: v for k, v in group.items() if k not in ("params", "prefix")}}
        if spec["name"] == "adagrad" and "initial_accumulator_value" in options:
            # torch.optim.Adagrad fills every group's `sum` from the constructor's value, not the group's
            options["initial_accumulator_value"] = defaults.get("initial_accumulator_value", 0.0)
        label = f"parameter group {number}" + (f" (prefix {group['prefix']!r})" if "prefix" in group else "")
        optim.check_options(spec["name"], options, label)
        if "params" in group:
            explicit = True
            indices = []
            for name in group["params"]:
                if name not in index_of:
                    raise GroupError(f"parameter group {number} names {name}, which the model does not have")
                indices.append(index_of[name])
        elif "prefix" in group:
            prefix = group["prefix"]
            indices = [i for i in trainable_indices if names[i].startswith(prefix)]
            if not indices:
                raise GroupError(f"parameter group {number}: no trainable parameter of the model starts with {prefix!r}")
            overlap = next((i for i in indices if i in taken), None)
            if overlap is not None:
                other = spec["groups"][taken[overlap]]
                other_text = f"prefix {other['prefix']!r}" if "prefix" in other else "by name"
                raise GroupError(f"parameter groups {taken[overlap]} ({other_text}) and {number} (prefix {prefix!r}) "
                                 f"overlap: {names[overlap]} is in both; give each parameter one group")
        else:
            raise GroupError(f"parameter group {number} needs 'params' (names) or 'prefix'")
        for i in indices:
            if not trainable[i]:
                raise GroupError(f"frozen parameter {names[i]} (requires_grad=False) is in parameter group {number}")
            if i in taken:
                raise GroupError(f"parameter {names[i]} is in parameter groups {taken[i]} and {number}")
            taken[i] = number
        groups.append((indices, options))
    rest = [i for i in trainable_indices if i not in taken]
    if rest and explicit:
        raise GroupError(f"parameter {names[rest[0]]} requires grad but is in no parameter group; "
                         "freeze it or add it to a group")
    if rest:
        groups.insert(0, (rest, defaults))
    return groups


def metadata_spec(name: str, groups: List[Tuple[List[int], Dict[str, Any]]], names: Sequence[str],
                  hyperparameters: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The optimizer entry of gradbridge.json: first group's options at the top (as before),
    plus ``groups`` with explicit names when there is more than one group."""
    spec: Dict[str, Any] = {"name": name, **hyperparameters[0]}
    # one group in another order than the model's keeps its names: the optimizer state follows it
    if len(groups) > 1 or groups[0][0] != sorted(groups[0][0]):
        spec["groups"] = [{"params": [names[i] for i in indices], **hyper}
                          for (indices, _), hyper in zip(groups, hyperparameters)]
    return spec


def torch_param_groups(spec: Dict[str, Any], named_parameters: Sequence[Tuple[str, torch.nn.Parameter]]) -> List[Dict]:
    """torch.optim param_groups for the spec (the reference's optimizer), trainable parameters only."""
    names = [n for n, _ in named_parameters]
    params = [p for _, p in named_parameters]
    resolved = resolve(spec, names, [p.requires_grad for p in params])
    groups = []
    for indices, options in resolved:
        options = dict(options)
        if "betas" in options:
            options["betas"] = tuple(options["betas"])
        groups.append({"params": [params[i] for i in indices], **options})
    return groups
