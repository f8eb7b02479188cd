"""The scripted training module: the protocol's methods (``gradbridge.protocol``) around a model, its
loss and its optimizer, as ``export_training_module`` scripts it.

The model comes twice: ``model`` runs in training mode and ``eval_model`` in eval mode (``_run`` picks by
the module's mode). A scripted model is one module under both names, its own ``training`` flag deciding; a
traced model is two traces, one taken in each mode (a trace freezes the mode it was taken in), sharing
the same parameter and buffer tensors.

The wrapper registers the model's own Parameter objects in an ``nn.ParameterList`` (identity
survives ``torch.jit.save``/``load``, so gradients and in-place updates reach the tensors that
``forward`` uses), and the model's buffers in a list (they follow the model's in-place updates).

Gradients live in an explicit list (``grads``) filled by ``torch.autograd.grad``, with a
``has_grad`` flag per parameter that plays the part of ``p.grad is None``. This sidesteps the
TorchScript trap in which an unset ``.grad`` is an undefined tensor that an ``is not None``
test lets through, and gives the gradients a fixed order, that of ``parameter_names()``.
As eager's ``AccumulateGrad`` steals the gradient autograd computed and ``zero_grad`` sets it to
None, the list takes autograd's (contiguous) tensors as they are and ``zero_grad`` drops them: no
copy, no zeroing pass per step. Two entries may then share one tensor (autograd hands the same
gradient to both inputs of an addition), so nothing writes into a gradient in place: accumulation
and clipping make new tensors (the same values as eager's in-place ops).
"""

from typing import Any, Dict, List

import torch
from torch import Tensor, nn

from .scripted_optimizer_state import _OptimizerState
from .scripted_state import _TensorAccess


class _TrainingModule(_TensorAccess, _OptimizerState):
    """The scripted protocol around ``model``; ``gradbridge.protocol`` lists the methods. Training here;
    the tensor getters and setters in ``_TensorAccess``, the optimizer state in ``_OptimizerState``."""

    # Class-level annotations: TorchScript cannot infer the type of an empty list.
    names: List[str]
    grads: List[Tensor]
    has_grad: List[bool]
    buffer_list: List[Tensor]
    buffer_name_list: List[str]
    trainable_index: List[int]
    group_index: List[List[int]]

    def __init__(self, model: nn.Module, eval_model: nn.Module, loss: nn.Module, optimizers: List[nn.Module],
                 parameter_names: List[str], parameters: List[nn.Parameter],
                 buffer_names: List[str], buffers: List[Tensor], *,
                 trainable_index: List[int], group_index: List[List[int]],
                 scheduler: nn.Module, scheduler_interval: str, lrs: List[float],
                 clip: Dict[str, Any], accumulate: int):
        super().__init__()
        self.model = model
        self.eval_model = eval_model
        self.loss = loss
        # One scripted optimizer per parameter group (torch.optim steps groups independently).
        self.optimizers = nn.ModuleList(optimizers)
        self.params = nn.ParameterList(parameters)
        self.names = parameter_names
        # Empty while a parameter has no gradient, so an exported file holds the parameters and
        # torch.optim's state, not a gradient per parameter.
        self.grads = [torch.empty(0, dtype=p.dtype) for p in parameters]
        self.has_grad = [False for _ in parameters]
        self.buffer_list = buffers
        self.buffer_name_list = buffer_names
        # Frozen parameters are not inputs of autograd.grad (it refuses tensors without grad).
        self.trainable_index = trainable_index
        self.group_index = group_index
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval  # "none", "step" or "epoch"
        self.clip_kind = str(clip.get("kind", "none"))  # "none", "norm" or "value"
        self.clip_max = float(clip.get("max", 0.0))
        self.clip_norm_type = float(clip.get("norm_type", 2.0))
        self.accumulate = int(accumulate)
        with torch.no_grad():
            self._set_lrs(lrs)
            self._set_momenta(scheduler.momenta())

    # The methods that take the model's input: one Tensor here, a list in ``_SeveralInputs``. Each
    # calls its list-based twin (``_forward``, ...), which both classes share.
    def forward(self, x: Tensor) -> Tensor:
        return self._run([x])

    @torch.jit.export
    def calculate_loss_and_backward(self, x: Tensor, y: Tensor) -> Tensor:
        """Forward, loss, backward; gradients add up as with ``loss.backward()``."""
        return self._loss_and_backward([x], y)

    @torch.jit.export
    def train_step(self, x: Tensor, y: Tensor) -> Tensor:
        """zero_grad, loss and backward, optimizer step: torch.optim's order. Returns the loss.
        (``_train_step`` says how gradient accumulation splits the batch.)"""
        return self._train_step([x], y)

    @torch.jit.export
    def train_epoch(self, x: Tensor, y: Tensor, perm: Tensor, batch_size: int) -> Tensor:
        """``train_step`` on ``x.index_select(0, perm[i:i + batch_size])`` for each batch; the losses."""
        return self._train_epoch([x], y, perm, batch_size)

    @torch.jit.export
    def evaluate(self, x: Tensor, y: Tensor) -> Tensor:
        """The loss without gradients, in the module's current mode (call eval() first to validate)."""
        return self._evaluate([x], y)

    def _run(self, xs: List[Tensor]) -> Tensor:
        """The model in the module's current mode (``train()`` / ``eval()``) on the inputs ``xs``."""
        if self.training:
            return self.model(xs[0])
        return self.eval_model(xs[0])

    def _parameters_list(self) -> List[Tensor]:
        return [p for p in self.params]

    def _trainable_list(self) -> List[Tensor]:
        params = self._parameters_list()
        return [params[i] for i in self.trainable_index]

    def _loss_and_backward(self, xs: List[Tensor], y: Tensor) -> Tensor:
        loss = self.loss(self._run(xs), y)
        self._backward(loss)
        return loss.detach()

    def _backward(self, loss: Tensor) -> None:
        """Add d(loss)/d(p) to the gradient buffers of the trainable parameters."""
        trainable = self._trainable_list()
        grads = torch.autograd.grad([loss], trainable, allow_unused=True)
        for k, grad in enumerate(grads):
            i = self.trainable_index[k]
            if grad is not None:
                if self.has_grad[i]:
                    self.grads[i] = self.grads[i] + grad
                else:
                    # contiguous as a parameter's: eager clones a gradient of other strides
                    self.grads[i] = grad.detach().contiguous()
                    self.has_grad[i] = True

    @torch.jit.export
    def zero_grad(self) -> None:
        """Like ``optimizer.zero_grad()`` (set_to_none): no parameter has a gradient afterwards."""
        for i in range(len(self.grads)):
            if self.has_grad[i]:
                self.grads[i] = torch.empty(0, dtype=self.grads[i].dtype)
                self.has_grad[i] = False

    @torch.jit.export
    def optimizer_step(self) -> None:
        """Clip (if exported), one step of each group's optimizer, the per-step schedule (if any);
        consumes (zeroes) the gradients. torch's order: clip_grad_*_, optimizer.step(), scheduler.step()."""
        with torch.no_grad():
            self._clip()
            params = self._parameters_list()
            for g, opt in enumerate(self.optimizers):
                index = self.group_index[g]
                opt.step([params[i] for i in index], [self.grads[i] for i in index], [self.has_grad[i] for i in index])
            if self.scheduler_interval == "step":
                self._set_lrs(self.scheduler.step(self.get_lrs()))
                self._set_momenta(self.scheduler.momenta())
        self.zero_grad()

    def _set_momenta(self, momenta: List[float]) -> None:
        """OneCycleLR's cycled momentum: SGD/RMSprop ``momentum``, Adam/AdamW ``beta1`` (torch's betas[0])."""
        if len(momenta) == 0:
            return
        for g, opt in enumerate(self.optimizers):
            if hasattr(opt, "beta1"):
                opt.beta1 = momenta[g]
            elif hasattr(opt, "momentum"):
                opt.momentum = momenta[g]

    def _clip(self) -> None:
        """torch.nn.utils.clip_grad_norm_ / clip_grad_value_ on CPU: their foreach path (the default)."""
        if self.clip_kind == "none":
            return
        present: List[int] = []
        for i in range(len(self.grads)):
            if self.has_grad[i]:
                present.append(i)
        if len(present) == 0:
            return
        # Tensor by tensor, out of place (see the module's docstring): on CPU the foreach kernels are
        # these same element-wise ops one tensor at a time (the "slow" path), so the bits agree.
        if self.clip_kind == "value":
            for i in present:
                self.grads[i] = self.grads[i].clamp_min(-self.clip_max).clamp_max(self.clip_max)
            return
        norms = torch._foreach_norm([self.grads[i] for i in present], self.clip_norm_type)
        total_norm = torch.linalg.vector_norm(torch.stack(norms), self.clip_norm_type)
        # eager `max_norm / (total_norm + 1e-6)` is Tensor.__rtruediv__: reciprocal() * max_norm
        clip_coef = (total_norm + 1e-6).reciprocal() * self.clip_max
        clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
        for i in present:
            self.grads[i] = self.grads[i] * clip_coef_clamped

    @torch.jit.export
    def schedule_epoch(self, metric: float) -> None:
        """The per-epoch schedule step, after an epoch: ReduceLROnPlateau gets ``metric`` (the
        validation loss, else the training loss); the others step; nothing for per-step schedules."""
        if self.scheduler_interval == "epoch":
            self._set_lrs(self.scheduler.step_metric(self.get_lrs(), metric))
            self._set_momenta(self.scheduler.momenta())

    @torch.jit.export
    def get_lrs(self) -> List[float]:
        """Each parameter group's learning rate, in group order."""
        lrs: List[float] = []
        for opt in self.optimizers:
            lrs.append(opt.lr)
        return lrs

    def _set_lrs(self, lrs: List[float]) -> None:
        for g, opt in enumerate(self.optimizers):
            opt.lr = lrs[g]

    @torch.jit.export
    def set_group_lr(self, group: int, lr: float) -> None:
        """Set one parameter group's learning rate."""
        if group < 0 or group >= len(self.group_index):
            raise RuntimeError("set_group_lr: no parameter group " + str(group) + "; there are "
                               + str(len(self.group_index)))
        if not lr >= 0.0:
            raise RuntimeError("set_group_lr: invalid learning rate " + str(lr))
        for g, opt in enumerate(self.optimizers):
            if g == group:
                opt.lr = lr

    @torch.jit.export
    def sgd_step(self, lr: float) -> None:
        """The seed's plain SGD, ``p.add_(g, alpha=-lr)`` (torch.optim.SGD's op); consumes the gradients."""
        with torch.no_grad():
            for i, p in enumerate(self.params):
                if self.has_grad[i]:
                    p.add_(self.grads[i], alpha=-lr)
        self.zero_grad()

    def _train_step(self, xs: List[Tensor], y: Tensor) -> Tensor:
        """zero_grad, loss and backward, optimizer step: torch.optim's order. Returns the loss.

        With gradient accumulation k > 1: the batch is split into micro-batches of
        ceil(n / k) rows (``split`` of every input), each adds the gradients of ``loss / k`` (the
        eager ``(loss / k).backward()`` loop), then one optimizer step; returns the sum of the
        ``loss / k`` values, in order.
        """
        self.zero_grad()
        if self.accumulate == 1:
            loss = self._loss_and_backward(xs, y)
        else:
            size = (y.size(0) + self.accumulate - 1) // self.accumulate
            parts = [x.split(size) for x in xs]
            ys = y.split(size)
            loss = torch.zeros([], dtype=xs[0].dtype)
            for m in range(len(ys)):
                scaled = self.loss(self._run([part[m] for part in parts]), ys[m]) / self.accumulate
                self._backward(scaled)
                if m == 0:
                    loss = scaled.detach()
                else:
                    loss = loss + scaled.detach()
        self.optimizer_step()
        return loss

    def _train_epoch(self, xs: List[Tensor], y: Tensor, perm: Tensor, batch_size: int) -> Tensor:
        if batch_size < 1:
            raise RuntimeError("train_epoch: batch_size must be at least 1, got " + str(batch_size))
        batch_losses: List[Tensor] = []
        for start in range(0, perm.size(0), batch_size):
            index = perm[start:start + batch_size]
            batch_losses.append(self._train_step([x.index_select(0, index) for x in xs], y.index_select(0, index)))
        return torch.stack(batch_losses)

    def _evaluate(self, xs: List[Tensor], y: Tensor) -> Tensor:
        with torch.no_grad():
            return self.loss(self._run(xs), y)

    @torch.jit.export
    def get_lr(self) -> float:
        """The first parameter group's learning rate (``get_lrs()`` has every group's)."""
        return self.get_lrs()[0]

    @torch.jit.export
    def set_lr(self, lr: float) -> None:
        """Set every parameter group's learning rate."""
        if not lr >= 0.0:
            raise RuntimeError("set_lr: invalid learning rate " + str(lr))
        for opt in self.optimizers:
            opt.lr = lr


class _SeveralInputs(_TrainingModule):
    """The protocol around a model of several named inputs: the methods that take the model's input
    take the list of its tensors, in the metadata's order (``gradbridge._runtime.inputs``); ``model`` and
    ``eval_model`` take that list too (``capture.keyword_call`` passes each tensor by name)."""

    def forward(self, xs: List[Tensor]) -> Tensor:
        return self._run(xs)

    @torch.jit.export
    def calculate_loss_and_backward(self, xs: List[Tensor], y: Tensor) -> Tensor:
        return self._loss_and_backward(xs, y)

    @torch.jit.export
    def train_step(self, xs: List[Tensor], y: Tensor) -> Tensor:
        return self._train_step(xs, y)

    @torch.jit.export
    def train_epoch(self, xs: List[Tensor], y: Tensor, perm: Tensor, batch_size: int) -> Tensor:
        return self._train_epoch(xs, y, perm, batch_size)

    @torch.jit.export
    def evaluate(self, xs: List[Tensor], y: Tensor) -> Tensor:
        return self._evaluate(xs, y)

    def _run(self, xs: List[Tensor]) -> Tensor:
        if self.training:
            return self.model(xs)
        return self.eval_model(xs)
