"""The scripted training module's optimizer state, as torch.optim's state dict holds it: every parameter
group's scripted optimizer (``spec.optimizers``) merged into one list per key, read out as copies and
loaded back with torch.optim's leniency for the keys it creates at a parameter's first step. A base of
``scripted_module._TrainingModule``, whose ``optimizers`` and ``group_index`` these methods read."""

from typing import Dict, List

import torch
from torch import Tensor, nn


class _OptimizerState(nn.Module):
    """``optimizer_state`` / ``load_optimizer_state`` over the groups' scripted optimizers."""

    @torch.jit.export
    def optimizer_state(self) -> Dict[str, List[Tensor]]:
        """The optimizer's per-parameter state, by torch.optim's key; copies. A key torch.optim creates at a
        parameter's first step (SGD's momentum_buffer, ``held()``) is left out while no parameter holds it,
        and a parameter that does not hold it yet has an empty tensor in its place: torch's state has none."""
        copied: Dict[str, List[Tensor]] = {}
        holders: Dict[str, int] = {}
        for opt in self.optimizers:
            held = opt.held()
            for key, values in opt.state().items():
                if key not in copied:
                    copied[key] = []
                    holders[key] = 0
                flags = held.get(key)
                for i in range(len(values)):
                    if flags is None or flags[i]:
                        copied[key].append(values[i].clone())
                        holders[key] += 1
                    else:
                        copied[key].append(torch.empty([0], dtype=values[i].dtype))
        lazy = self._lazy_keys()
        state: Dict[str, List[Tensor]] = {}
        for key, values in copied.items():
            if holders[key] > 0 or key not in lazy:
                state[key] = values
        return state

    def _optimizer_state(self) -> Dict[str, List[Tensor]]:
        """Every group's state lists, concatenated in group order (torch.optim's state_dict order)."""
        merged: Dict[str, List[Tensor]] = {}
        for opt in self.optimizers:
            for key, values in opt.state().items():
                if key not in merged:
                    merged[key] = []
                merged[key].extend(values)
        return merged

    def _lazy_keys(self) -> List[str]:
        """The state keys torch.optim creates at a parameter's first step (the optimizers' ``held()``)."""
        keys: List[str] = []
        for opt in self.optimizers:
            for key in opt.held().keys():
                if key not in keys:
                    keys.append(key)
        return keys

    @torch.jit.export
    def load_optimizer_state(self, state: Dict[str, List[Tensor]]) -> None:
        """Restore what ``optimizer_state()`` returned (keys, counts and shapes must match). As torch.optim
        loads a state dict, a key it creates at a parameter's first step (SGD's momentum_buffer) may be
        absent (no parameter holds it) or hold an empty tensor for a parameter without it: that
        parameter's next step creates it, as torch's does."""
        params = self._parameters_list()
        for g, opt in enumerate(self.optimizers):
            opt.allocate([params[i] for i in self.group_index[g]])
        own = self._optimizer_state()
        lazy = self._lazy_keys()
        for key in state.keys():
            if key not in own:
                raise RuntimeError("load_optimizer_state: unexpected key " + key)
        for key, values in own.items():
            if key not in state:
                if key in lazy:
                    continue
                raise RuntimeError("load_optimizer_state: missing key " + key)
            given = state[key]
            if len(given) != len(values):
                raise RuntimeError("load_optimizer_state: " + key + " has " + str(len(given)) + " tensors, expected "
                                   + str(len(values)))
            for i in range(len(values)):
                if given[i].shape != values[i].shape and not (key in lazy and given[i].shape == [0]):
                    raise RuntimeError("load_optimizer_state: " + key + "[" + str(i) + "] has the wrong shape")
        with torch.no_grad():
            for key, values in own.items():
                if key in state:
                    for i in range(len(values)):
                        if state[key][i].shape == values[i].shape:
                            values[i].copy_(state[key][i])
        # per optimizer (group), which of its parameters the state holds each lazy key for
        start: Dict[str, int] = {}
        for opt in self.optimizers:
            held: Dict[str, List[bool]] = {}
            for key, values in opt.state().items():
                at = start.get(key, 0)
                if key in lazy:
                    flags: List[bool] = []
                    for i in range(len(values)):
                        flags.append(key in state and state[key][at + i].shape == values[i].shape)
                    held[key] = flags
                start[key] = at + len(values)
            opt.loaded(held)
