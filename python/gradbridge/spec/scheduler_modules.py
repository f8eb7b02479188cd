"""The scripted learning-rate schedules, the arithmetic of torch.optim.lr_scheduler 2.7.1 (``schedulers``
turns specs into them).

torch's ``scheduler.step()`` computes each new lr with the *chainable* ``get_lr()`` (from the
group's current lr), not with the closed form; the two round differently, so each class here
copies ``get_lr()`` operation for operation (Python floats are doubles, as in TorchScript;
``math.cos`` is the same libm call). ``closed_form`` is only used where torch uses it:
``SequentialLR`` restarts a schedule with ``step(0)``.

Every module has::

    step(lrs) -> lrs           # one scheduler.step(); lrs: one per parameter group
    step_metric(lrs, metric)   # ReduceLROnPlateau.step(metric); the others ignore the metric

A spec ``{"name": "cosine", "T_max": 100, ...}`` round-trips through the metadata; the Python
reference rebuilds the real torch scheduler from it (``torch_scheduler``).
"""


import math
from typing import List

import torch
from torch import nn


class _Base(nn.Module):
    last_epoch: int
    base_lrs: List[float]

    def __init__(self, base_lrs: List[float]):
        super().__init__()
        self.last_epoch = 0  # a fresh torch scheduler has made its initial step
        self.base_lrs = [float(v) for v in base_lrs]

    def forward(self, lrs: List[float]) -> List[float]:
        # Every schedule's forward is its `step`, which each subclass defines (TorchScript
        # compiles this on the concrete class).
        return self.step(lrs)

    @torch.jit.export
    def step_metric(self, lrs: List[float], metric: float) -> List[float]:
        return self.step(lrs)

    @torch.jit.export
    def restart(self, lrs: List[float]) -> List[float]:
        """``step(0)`` as SequentialLR calls it: last_epoch = 0, the closed form."""
        self.last_epoch = 0
        return self.closed_form(lrs)

    @torch.jit.export
    def closed_form(self, lrs: List[float]) -> List[float]:
        return lrs

    @torch.jit.export
    def momenta(self) -> List[float]:
        """Momentum (SGD, RMSprop) or beta1 (Adam) per group after the last step; empty: unchanged."""
        return []


class NoSchedule(_Base):
    """No scheduler: the lrs stay as they are."""

    @torch.jit.export
    def step(self, lrs: List[float]) -> List[float]:
        return lrs


class StepLR(_Base):
    """lr * gamma when last_epoch > 0 and last_epoch % step_size == 0, else lr."""

    def __init__(self, base_lrs: List[float], step_size: int, gamma: float = 0.1):
        super().__init__(base_lrs)
        self.step_size = int(step_size)
        self.gamma = float(gamma)

    @torch.jit.export
    def step(self, lrs: List[float]) -> List[float]:
        self.last_epoch += 1
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return lrs
        return [lr * self.gamma for lr in lrs]

    @torch.jit.export
    def closed_form(self, lrs: List[float]) -> List[float]:
        return [b * self.gamma ** (self.last_epoch // self.step_size) for b in self.base_lrs]


class MultiStepLR(_Base):
    """lr * gamma ** (times last_epoch is a milestone)."""

    milestones: List[int]

    def __init__(self, base_lrs: List[float], milestones: List[int], gamma: float = 0.1):
        super().__init__(base_lrs)
        self.milestones = sorted(int(m) for m in milestones)
        self.gamma = float(gamma)

    @torch.jit.export
    def step(self, lrs: List[float]) -> List[float]:
        self.last_epoch += 1
        count = 0
        for m in self.milestones:
            if m == self.last_epoch:
                count += 1
        if count == 0:
            return lrs
        return [lr * self.gamma ** count for lr in lrs]

    @torch.jit.export
    def closed_form(self, lrs: List[float]) -> List[float]:
        passed = 0
        for m in self.milestones:
            if m <= self.last_epoch:
                passed += 1
        return [b * self.gamma ** passed for b in self.base_lrs]


class ExponentialLR(_Base):
    """lr * gamma every step (not at last_epoch 0)."""

    def __init__(self, base_lrs: List[float], gamma: float):
        super().__init__(base_lrs)
        self.gamma = float(gamma)

    @torch.jit.export
    def step(self, lrs: List[float]) -> List[float]:
        self.last_epoch += 1
        if self.last_epoch == 0:
            return lrs
        return [lr * self.gamma for lr in lrs]

    @torch.jit.export
    def closed_form(self, lrs: List[float]) -> List[float]:
        return [b * self.gamma ** self.last_epoch for b in self.base_lrs]


class CosineAnnealingLR(_Base):
    """torch's recursive cosine form (including its restart branch); see CosineAnnealingLR.get_lr."""

    def __init__(self, base_lrs: List[float], T_max: int, eta_min: float = 0.0):
        super().__init__(base_lrs)
        self.T_max = int(T_max)
        self.eta_min = float(eta_min)

    @torch.jit.export
    def step(self, lrs: List[float]) -> List[float]:
        self.last_epoch += 1
        e = self.last_epoch
        if e == 0:
            return lrs
        out: List[float] = []
        if (e - 1 - self.T_max) % (2 * self.T_max) == 0:
            for i in range(len(lrs)):
                out.append(lrs[i] + (self.base_lrs[i] - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2)
            return out
        for lr in lrs:
            out.append((1 + math.cos(math.pi * e / self.T_max)) / (1 + math.cos(math.pi * (e - 1) / self.T_max))
                       * (lr - self.eta_min) + self.eta_min)
        return out

    @torch.jit.export
    def closed_form(self, lrs: List[float]) -> List[float]:
        return [self.eta_min + (b - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for b in self.base_lrs]


class LinearLR(_Base):
    """torch's chainable linear warm-up/decay factor (LinearLR.get_lr)."""

    def __init__(self, base_lrs: List[float], start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5):
        super().__init__(base_lrs)
        self.start_factor = float(start_factor)
        self.end_factor = float(end_factor)
        self.total_iters = int(total_iters)

    @torch.jit.export
    def step(self, lrs: List[float]) -> List[float]:
        self.last_epoch += 1
        e = self.last_epoch
        if e == 0:
            return [lr * self.start_factor for lr in lrs]
        if e > self.total_iters:
            return lrs
        return [lr * (1.0 + (self.end_factor - self.start_factor)
                      / (self.total_iters * self.start_factor + (e - 1) * (self.end_factor - self.start_factor)))
                for lr in lrs]

    @torch.jit.export
    def closed_form(self, lrs: List[float]) -> List[float]:
        return [b * (self.start_factor + (self.end_factor - self.start_factor) * min(self.total_iters, self.last_epoch)
                     / self.total_iters) for b in self.base_lrs]


class OneCycleLR(_Base):
    """OneCycleLR.get_lr (cos or linear annealing, two or three phases), cycling the momentum (or
    Adam's beta1) between max_momentum and base_momentum when cycle_momentum is set."""

    end_steps: List[float]
    start_keys: List[int]
    end_keys: List[int]
    max_momenta: List[float]
    base_momenta: List[float]
    last_momenta: List[float]

    def __init__(self, base_lrs: List[float], max_lrs: List[float], total_steps: int, pct_start: float,
                 div_factor: float, final_div_factor: float, three_phase: bool, anneal_strategy: str,
                 cycle_momentum: bool = False, max_momenta: List[float] = (), base_momenta: List[float] = ()):
        super().__init__(base_lrs)
        self.cycle_momentum = bool(cycle_momentum)
        self.max_momenta = [float(m) for m in max_momenta]
        self.base_momenta = [float(m) for m in base_momenta]
        self.last_momenta = []
        self.total_steps = int(total_steps)
        # per group: 0 initial_lr, 1 max_lr, 2 min_lr, computed as torch does at construction
        self.initial = [m / div_factor for m in max_lrs]
        self.max_lrs = [float(m) for m in max_lrs]
        self.min_lrs = [i / final_div_factor for i in self.initial]
        if three_phase:
            self.end_steps = [float(pct_start * total_steps) - 1, float(2 * pct_start * total_steps) - 2,
                              float(total_steps - 1)]
            self.start_keys, self.end_keys = [0, 1, 0], [1, 0, 2]
        else:
            self.end_steps = [float(pct_start * total_steps) - 1, float(total_steps - 1)]
            self.start_keys, self.end_keys = [0, 1], [1, 2]
        # momentum phases: 3 = max_momentum, 4 = base_momentum (torch's start/end_momentum keys)
        self.start_momentum_keys = [3, 4, 3] if three_phase else [3, 4]
        self.end_momentum_keys = [4, 3, 3] if three_phase else [4, 3]
        self.cos = anneal_strategy == "cos"

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.cos:
            cos_out = math.cos(math.pi * pct) + 1
            return end + (start - end) / 2.0 * cos_out
        return (end - start) * pct + start

    @torch.jit.export
    def momenta(self) -> List[float]:
        return self.last_momenta

    def _value(self, key: int, group: int) -> float:
        if key == 0:
            return self.initial[group]
        if key == 1:
            return self.max_lrs[group]
        if key == 2:
            return self.min_lrs[group]
        if key == 3:
            return self.max_momenta[group]
        return self.base_momenta[group]

    @torch.jit.export
    def step(self, lrs: List[float]) -> List[float]:
        self.last_epoch += 1
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise RuntimeError("Tried to step " + str(step_num) + " times. The specified number of total steps is "
                               + str(self.total_steps))
        out: List[float] = []
        momenta: List[float] = []
        for g in range(len(lrs)):
            start_step = 0.0
            computed = 0.0
            momentum = 0.0
            for i in range(len(self.end_steps)):
                end_step = self.end_steps[i]
                if step_num <= end_step or i == len(self.end_steps) - 1:
                    pct = (step_num - start_step) / (end_step - start_step)
                    computed = self._anneal(self._value(self.start_keys[i], g), self._value(self.end_keys[i], g), pct)
                    if self.cycle_momentum:
                        momentum = self._anneal(self._value(self.start_momentum_keys[i], g),
                                                self._value(self.end_momentum_keys[i], g), pct)
                    break
                start_step = self.end_steps[i]
            out.append(computed)
            momenta.append(momentum)
        if self.cycle_momentum:
            self.last_momenta = momenta
        return out


class SequentialLR(_Base):
    """SequentialLR.step: the child for bisect_right(milestones, epoch); at a milestone, child.step(0)."""

    milestones: List[int]

    def __init__(self, base_lrs: List[float], children: List[nn.Module], milestones: List[int]):
        super().__init__(base_lrs)
        self.children_list = nn.ModuleList(children)
        self.milestones = [int(m) for m in milestones]

    @torch.jit.export
    def step(self, lrs: List[float]) -> List[float]:
        self.last_epoch += 1
        idx = 0
        for m in self.milestones:
            if m <= self.last_epoch:
                idx += 1
        restart = idx > 0 and self.milestones[idx - 1] == self.last_epoch
        out = lrs
        for i, child in enumerate(self.children_list):
            if i == idx:
                out = child.restart(lrs) if restart else child.step(lrs)
        return out


class ReduceLROnPlateau(_Base):
    """ReduceLROnPlateau.step(metric): best, bad epochs, cooldown, max(lr * factor, min_lr) if > eps."""

    min_lrs: List[float]

    def __init__(self, base_lrs: List[float], mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lrs: List[float] = (), eps: float = 1e-8):
        super().__init__(base_lrs)
        self.minimize = mode == "min"
        self.relative = threshold_mode == "rel"
        self.factor = float(factor)
        self.patience = int(patience)
        self.threshold = float(threshold)
        self.cooldown = int(cooldown)
        self.cooldown_counter = 0
        self.min_lrs = [float(v) for v in min_lrs]
        self.eps = float(eps)
        self.best = math.inf if self.minimize else -math.inf
        self.num_bad_epochs = 0

    @torch.jit.export
    def step(self, lrs: List[float]) -> List[float]:
        raise RuntimeError("ReduceLROnPlateau steps with a metric (step_metric)")

    def _is_better(self, a: float, best: float) -> bool:
        if self.minimize and self.relative:
            return a < best * (1.0 - self.threshold)
        if self.minimize:
            return a < best - self.threshold
        if self.relative:
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    @torch.jit.export
    def step_metric(self, lrs: List[float], metric: float) -> List[float]:
        self.last_epoch += 1
        if self._is_better(metric, self.best):
            self.best = metric
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        out = lrs
        if self.num_bad_epochs > self.patience:
            out = []
            for i in range(len(lrs)):
                new_lr = max(lrs[i] * self.factor, self.min_lrs[i])
                out.append(new_lr if lrs[i] - new_lr > self.eps else lrs[i])
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        return out
