"""The scripted training module's tensor access (``gradbridge.protocol``'s getters and setters): its
parameters, gradients and buffers read and written by name or in ``parameter_names()`` order, each
write checked whole before anything is copied. A base of ``scripted_module._TrainingModule``, whose
attributes (``params``, ``names``, ``grads``, ``has_grad``, ``buffer_list``, ...) these methods read."""

from typing import Dict, List

import torch
from torch import Tensor, nn


class _TensorAccess(nn.Module):
    """Parameters, gradients, buffers and a version's state, in and out of the scripted module."""

    @torch.jit.export
    def parameter_names(self) -> List[str]:
        return self.names

    @torch.jit.export
    def get_parameters(self) -> List[Tensor]:
        return [p.detach().clone() for p in self.params]

    @torch.jit.export
    def get_gradients(self) -> List[Tensor]:
        # zeros for a parameter without a gradient, as its zeroed buffer held; nothing is allocated
        return [self.grads[i].clone() if self.has_grad[i] else torch.zeros_like(p, memory_format=torch.contiguous_format)
                for i, p in enumerate(self._parameters_list())]

    @torch.jit.export
    def gradient_flags(self) -> Tensor:
        """Which parameters hold a gradient (``p.grad is not None``), a bool tensor in
        ``parameter_names()`` order (protocol 2)."""
        return torch.tensor(self.has_grad, dtype=torch.bool)

    @torch.jit.export
    def set_gradients(self, values: List[Tensor], flags: Tensor) -> None:
        """Replace the gradient buffers with ``values`` (``parameter_names()`` order) and which of
        them hold a gradient with ``flags`` (bool); a following ``optimizer_step()`` steps with them,
        as ``p.grad = value`` (or ``None``) then ``optimizer.step()`` would (protocol 2)."""
        if len(values) != len(self.names) or flags.dim() != 1 or flags.size(0) != len(self.names):
            raise RuntimeError("set_gradients: expected " + str(len(self.names)) + " tensors and "
                               + str(len(self.names)) + " flags, got " + str(len(values)) + " and "
                               + str(flags.numel()))
        present: List[bool] = [bool(flags[i].item()) for i in range(len(self.names))]
        trainable = [False for _ in self.names]
        for i in self.trainable_index:
            trainable[i] = True
        for i, p in enumerate(self._parameters_list()):
            if values[i].shape != p.shape or values[i].dtype != p.dtype:
                raise RuntimeError("set_gradients: " + self.names[i] + " must have shape " + str(p.shape)
                                   + " and dtype " + str(p.dtype))
            if present[i] and not trainable[i]:
                raise RuntimeError("set_gradients: " + self.names[i] + " is frozen and cannot hold a gradient")
        self.zero_grad()
        with torch.no_grad():
            for i in range(len(self.names)):
                if present[i]:
                    self.grads[i] = values[i].clone(memory_format=torch.contiguous_format)
                    self.has_grad[i] = True

    @torch.jit.export
    def set_parameters(self, values: List[Tensor]) -> None:
        if len(values) != len(self.names):
            raise RuntimeError("set_parameters: expected " + str(len(self.names)) + " tensors, got " + str(len(values)))
        for i, p in enumerate(self.params):
            if values[i].shape != p.shape or values[i].dtype != p.dtype:
                raise RuntimeError("set_parameters: " + self.names[i] + " must have shape " + str(p.shape)
                                   + " and dtype " + str(p.dtype))
        with torch.no_grad():
            for i, p in enumerate(self.params):
                p.copy_(values[i])

    @torch.jit.export
    def buffer_names(self) -> List[str]:
        return self.buffer_name_list

    @torch.jit.export
    def get_buffers(self) -> List[Tensor]:
        return [b.clone() for b in self.buffer_list]

    @torch.jit.export
    def get_state(self, names: List[str]) -> List[Tensor]:
        """Copies of the named parameters and buffers, in the order of ``names``: a version's trainable
        parameters and trained buffers, without copying the frozen rest."""
        wanted = self._state_index(names, "get_state")
        out: List[Tensor] = [torch.empty(0) for _ in names]
        for i, p in enumerate(self.params):
            if self.names[i] in wanted:
                out[wanted[self.names[i]]] = p.detach().clone()
        for i, b in enumerate(self.buffer_list):
            if self.buffer_name_list[i] in wanted:
                out[wanted[self.buffer_name_list[i]]] = b.detach().clone()
        return out

    @torch.jit.export
    def set_state(self, names: List[str], values: List[Tensor]) -> None:
        """Copy ``values`` into the named parameters and buffers (any of them, any order): a published
        version's trainable parameters and trained buffers. Checked whole before anything is copied."""
        if len(values) != len(names):
            raise RuntimeError("set_state: " + str(len(names)) + " names, " + str(len(values)) + " tensors")
        wanted = self._state_index(names, "set_state")
        for i, p in enumerate(self.params):
            self._check_state(wanted, self.names[i], p, values)
        for i, b in enumerate(self.buffer_list):
            self._check_state(wanted, self.buffer_name_list[i], b, values)
        with torch.no_grad():
            for i, p in enumerate(self.params):
                if self.names[i] in wanted:
                    p.copy_(values[wanted[self.names[i]]])
            for i, b in enumerate(self.buffer_list):
                if self.buffer_name_list[i] in wanted:
                    b.copy_(values[wanted[self.buffer_name_list[i]]])

    def _state_index(self, names: List[str], method: str) -> Dict[str, int]:
        """name -> its position in ``names``; every name must be a parameter or a buffer, once."""
        wanted: Dict[str, int] = {}
        for k, name in enumerate(names):
            if name in wanted or (name not in self.names and name not in self.buffer_name_list):
                raise RuntimeError(method + ": " + name + " is not a parameter or buffer, or is named twice")
            wanted[name] = k
        return wanted

    def _check_state(self, wanted: Dict[str, int], name: str, t: Tensor, values: List[Tensor]) -> None:
        if name in wanted:
            v = values[wanted[name]]
            if v.shape != t.shape or v.dtype != t.dtype:
                raise RuntimeError("set_state: " + name + " must have shape " + str(t.shape) + " and dtype "
                                   + str(t.dtype))
