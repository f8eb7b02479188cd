"""The Java online learner's decisions as the eager replay takes them (``gradbridge.replay``): a micro-batch's
guarded step (``dev.gradbridge.online.Updater``, ``UpdateGuard``) and the publish gate with its kept versions and
rollbacks (``Gate``, ``Publisher``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Tuple

import numpy as np

from .errors import LogError
from .feedback_log import GATE_HELD, GATE_PUBLISHED, GATE_ROLLED_BACK, FeedbackLog, Gate, Rollback, file_sha256


def guarded_step(reference, x, y, names: List[str], max_grad_norm: float,
                  seed: int | None = None) -> Tuple[float, str | None]:
    """The Java learner's update (dev.gradbridge.online.UpdateGuard, Updater): loss and gradients,
    then torch.optim's step unless the loss or a gradient is not finite or the gradient norm (summed
    in float64, element by element in protocol order) exceeds ``max_grad_norm`` (0: no limit); a
    step that leaves a parameter or the optimizer's state not finite is undone. Returns the loss and
    None when applied, else the reason it was not."""
    from ._runtime.torchscript import plain_graph_executor

    import torch

    with plain_graph_executor():
        reference.optimizer.zero_grad()
        if seed is not None:  # the micro-batch's draws, as the Java learner's (Updater, SeededDraws)
            torch.manual_seed(seed)
        loss = reference.loss_of(reference.model, x, y)  # under the module's autocast region, if any
        loss.backward()
        value = float(loss.detach())
        reason = None
        if not math.isfinite(value):
            reason = f"loss is {value}"
        else:
            params = dict(reference.named_parameters())
            squares = np.zeros(1)
            for name in names:
                grad = params[name].grad
                if grad is None:
                    continue
                values = grad.detach().double().flatten().numpy()
                if not np.isfinite(values).all():
                    reason = f"gradient of {name} is not finite"
                    break
                squares = np.cumsum(np.concatenate([squares[-1:], values * values]))[-1:]  # sequential, as Java
            norm = math.sqrt(float(squares[-1]))
            if reason is None and max_grad_norm > 0 and not norm <= max_grad_norm:
                reason = f"gradient norm {norm} exceeds --max-grad-norm {max_grad_norm}"
        if reason is None:
            saved = _state(reference)
            reference._clip()
            reference.optimizer.step()
            if reference.scheduler is not None and reference.scheduler_interval == "step":
                reference.scheduler.step()
            bad = _not_finite(reference, names)
            if bad is not None:  # the Java learner undoes such a step (Updater.undoUnlessFinite)
                _restore(reference, saved)
                reason = f"the update makes {bad} not finite"
        if reason is not None:
            reference.optimizer.zero_grad()
    return value, reason


def _state(reference):
    """The parameters, optimizer and scheduler state before a step, to undo it."""
    import copy

    params = {name: p.detach().clone() for name, p in reference.model.named_parameters()}
    optimizer = copy.deepcopy(reference.optimizer.state_dict())
    scheduler = copy.deepcopy(reference.scheduler.state_dict()) if reference.scheduler is not None else None
    return params, optimizer, scheduler


def _restore(reference, saved) -> None:
    import torch

    params, optimizer, scheduler = saved
    with torch.no_grad():
        for name, p in reference.model.named_parameters():
            p.copy_(params[name])
    reference.optimizer.load_state_dict(optimizer)
    if scheduler is not None:
        reference.scheduler.load_state_dict(scheduler)


def _not_finite(reference, names: List[str]) -> str | None:
    """The first parameter (protocol order), else optimizer state (by key, then parameter), that is
    not finite after a step, as the Java learner names it; None when all are finite."""
    import torch

    params = dict(reference.named_parameters())
    for name in names:
        if not torch.isfinite(params[name].detach()).all():
            return f"parameter {name}"
    states = [reference.optimizer.state.get(params[name], {}) for name in names]
    for key in sorted({key for state in states for key in state}):
        for name, state in zip(names, states):
            value = state.get(key)
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all():
                return f"the optimizer's {key} of {name}"
    return None


class PublishGate:
    """The publish gate as the Java learner runs it (dev.gradbridge.online.Gate, Publisher): the gate
    data's loss in eval mode, one evaluate over the whole file; published when at most the serving
    version's plus max_regression; the published versions kept (the last keep_versions), and under
    the rollback policy the learner's state with each."""

    def __init__(self, log: FeedbackLog, settings: dict, metadata: dict, reference, gate_data) -> None:
        from ._runtime import data

        self.log = log
        self.max_regression = float(settings["max_regression"])
        self.rollback = settings["on_hold"] == "rollback"
        self.keep = int(settings["keep_versions"])
        self.reference = reference
        self.x = self.y = None
        path = Path(gate_data) if gate_data is not None else Path(settings.get("data") or "")
        if gate_data is not None and not path.is_file():
            raise LogError(f"--gate-data {path}: no such file")
        if path.is_file():
            sha = file_sha256(path)
            if sha == settings["data_sha256"]:
                x, y = data.load_checked(metadata, path)
                self.x, self.y = data.tensors(metadata, x, y, str(path))  # a 16-bit input's carrier cast
            elif gate_data is not None:
                raise LogError(f"--gate-data {path} is not the gate data {log.path} was written with (SHA-256 {sha}, "
                               f"the log's {settings['data_sha256']})")
        #: (version id, gate loss, learner state or None), oldest first; the last serves
        self.kept: List[Tuple[int, float, object]] = []

    @property
    def checks_losses(self) -> bool:
        return self.x is not None

    def loss(self) -> float | None:
        return float(self.reference.evaluate(self.x, self.y)) if self.checks_losses else None

    def start(self, version: int, first: Gate | None) -> None:
        loss = self.loss()
        if loss is None:  # taken from the first decision, or unknown (no decision yet)
            loss = first.serving_loss if first is not None else float("nan")
        self.kept = [(version, loss, _state(self.reference) if self.rollback else None)]

    def decision(self, loss: float) -> int:
        if loss <= self.kept[-1][1] + self.max_regression:
            return GATE_PUBLISHED
        return GATE_ROLLED_BACK if self.rollback else GATE_HELD

    def apply(self, version: int, loss: float, decision: int) -> None:
        if decision == GATE_PUBLISHED:
            self.kept.append((version, loss, _state(self.reference) if self.rollback else None))
            del self.kept[:-self.keep]
        elif decision == GATE_ROLLED_BACK:
            self.restore()

    def roll_back(self, record: Rollback) -> None:
        ids = [k[0] for k in self.kept]
        if record.version not in ids or record.previous != ids[-1]:
            raise LogError(f"{self.log.path}: offset {record.offset}: a rollback from version {record.previous} to "
                           f"version {record.version}, which the replay cannot reproduce (serving: {ids[-1]}, kept: {ids})")
        del self.kept[ids.index(record.version) + 1:]
        if self.rollback:
            self.restore()

    def restore(self) -> None:
        import copy

        _restore(self.reference, copy.deepcopy(self.kept[-1][2]))  # load_state_dict may keep the tensors it is given
