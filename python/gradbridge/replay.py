"""Replay an online learner's feedback log with eager PyTorch and check every published version.

``dev.gradbridge.online.OnlineLearner`` (Java) logs every accepted feedback event, every
micro-batch before it is applied and every published version with SHA-256 digests of its
parameters (format: ``dev.gradbridge.online.LogFormat``). ``replay`` starts from the exported
module's initial tensors, applies the logged micro-batches in order with ``reference.Reference``
(torch.optim, eager autograd) and compares each logged version's digests and loss with its own:
equal digests mean bitwise equal parameters.

The log's format and its strict reader are ``gradbridge.feedback_log`` (re-exported here).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from . import protocol
from ._runtime import shuffle
from .errors import LogError  # also importable from here, as before
from .feedback_log import (  # noqa: F401  (re-exported: the reader and format, as before)
    CHECKPOINT_FILE, FILE_NAME, FORMAT, FORMAT_VERSION, FRAME_HEADER, GATE_HELD, GATE_PUBLISHED, GATE_ROLLED_BACK,
    MAX_PAYLOAD, RECORD_TYPES, Batch, FeedbackLog, Gate, Quarantine, Rollback, Version, check_checkpoint, crc32c,
    file_sha256, frame, frames, read_log)
from .history import digest

_NUMPY = {"float32": "<f4", "float64": "<f8", "int64": "<i8"}


@dataclass
class VersionRow:
    version: int
    updates: int
    events: int
    loss_java: float
    loss_python: float
    digest_java: str
    digest_python: str

    @property
    def match(self) -> bool:
        same_loss = (self.loss_java == self.loss_python) or (math.isnan(self.loss_java) and math.isnan(self.loss_python))
        return self.digest_java == self.digest_python and same_loss


def _same(a: float, b: float) -> bool:
    """Equal bit for bit as the learner compares doubles (NaN equals NaN)."""
    return a == b or (math.isnan(a) and math.isnan(b))


@dataclass
class GateRow:
    """A publish gate's decision on a version, as the learner logged it and as the replay took it."""

    version: int
    serving: int
    serving_python: int
    loss_java: float
    loss_python: float
    serving_loss_java: float
    serving_loss_python: float
    decision_java: int
    decision_python: int

    @property
    def match(self) -> bool:
        return (self.serving == self.serving_python and _same(self.loss_java, self.loss_python)
                and _same(self.serving_loss_java, self.serving_loss_python) and self.decision_java == self.decision_python)


DECISIONS = {GATE_PUBLISHED: "published", GATE_HELD: "held back", GATE_ROLLED_BACK: "held back, rolled back"}


@dataclass
class ReplayReport:
    """Every logged version, as Java published it and as the eager replay computed it."""

    model: str
    log: str
    rows: List[VersionRow]
    batches: int
    events: int
    unapplied_events: int
    torn_bytes: int
    #: version id -> parameters and the buffers training writes, by name (only with ``keep_parameters=True``)
    parameters: Dict[int, Dict[str, "object"]] = field(default_factory=dict)
    #: micro-batches not applied (loss or gradients not finite, or over the norm limit), as logged
    quarantined: int = 0
    #: every publish gate decision (a gated log only)
    gates: List[GateRow] = field(default_factory=list)
    #: whether the gate losses were computed again from the gate data (else taken from the log)
    gate_losses_checked: bool = False
    #: rollbacks (POST /admin/rollback) applied
    rollbacks: int = 0
    #: the version serving at the end of the log
    serving: int = 0
    #: events read again from the Kafka topic instead of the log (``from_kafka``)
    from_topic: int = 0

    @property
    def bitwise(self) -> bool:
        return bool(self.rows) and all(row.match for row in self.rows) and all(gate.match for gate in self.gates)

    def verdict(self) -> str:
        gated = ""
        if self.gates:
            held = sum(1 for g in self.gates if g.decision_java != GATE_PUBLISHED)
            gated = (f", {len(self.gates)} gate decisions ({held} held back; losses "
                     f"{'recomputed' if self.gate_losses_checked else 'taken from the log: no gate data'})")
        if self.rollbacks:
            gated += f", {self.rollbacks} rollbacks"
        if self.bitwise:
            return (f"bitwise identical: {len(self.rows)} versions, {self.batches} micro-batches, "
                    f"{self.events} events{gated}")
        if not self.rows:
            return "no versions in the log"
        bad = next((row for row in self.rows if not row.match), None)
        if bad is None:
            g = next(gate for gate in self.gates if not gate.match)
            return (f"differs at the gate decision on version {g.version}: loss {g.loss_java!r} (java) vs {g.loss_python!r}"
                    f" (python), serving version {g.serving} vs {g.serving_python} with loss {g.serving_loss_java!r} vs "
                    f"{g.serving_loss_python!r}, {DECISIONS[g.decision_java]} vs {DECISIONS[g.decision_python]}")
        return (f"differs at version {bad.version} ({bad.updates} updates): loss {bad.loss_java!r} (java) vs "
                f"{bad.loss_python!r} (python), digest {bad.digest_java[:16]} vs {bad.digest_python[:16]}")

    def table(self) -> str:
        lines = [f"{'version':>7}  {'updates':>7}  {'events':>7}  {'loss java':>15}  {'loss python':>15}  "
                 f"{'digest java':<16}  {'digest python':<16}  match"]
        for r in self.rows:
            lines.append(f"{r.version:>7}  {r.updates:>7}  {r.events:>7}  {r.loss_java:>15.9g}  {r.loss_python:>15.9g}  "
                         f"{r.digest_java[:16]:<16}  {r.digest_python[:16]:<16}  {'yes' if r.match else 'NO'}")
        if self.gates:
            lines.append(f"{'gate on':>7}  {'serving':>7}  {'gate loss java':>15}  {'gate loss python':>16}  "
                         f"{'serving loss':>15}  decision")
            for g in self.gates:
                lines.append(f"{g.version:>7}  {g.serving:>7}  {g.loss_java:>15.9g}  {g.loss_python:>16.9g}  "
                             f"{g.serving_loss_java:>15.9g}  {DECISIONS[g.decision_java]}"
                             f"{'' if g.match else '  NO (python: ' + DECISIONS[g.decision_python] + ')'}")
        lines.append(f"python replay: {self.verdict()}")
        return "\n".join(lines)


def _combined(digests: Dict[str, str], names: List[str]) -> str:
    """One digest over the parameters' digests in protocol order (short to print, exact to compare)."""
    import hashlib

    return hashlib.sha256(",".join(digests.get(name, "?") for name in names).encode()).hexdigest()


def _input_specs(log: FeedbackLog) -> List[Tuple[str, str, List[int]]]:
    """(name, dtype, per-sample shape) of each input, in the order an event's x bytes hold them: ``x``,
    or the header's ``inputs`` for a module of several inputs."""
    if "inputs" in log.header:
        return [(spec["name"], spec["dtype"], list(spec["shape"])) for spec in log.header["inputs"]]
    return [("x", log.header.get("x", {}).get("dtype"), list(log.header.get("x", {}).get("shape", [])))]


def _check_header(log: FeedbackLog, metadata: dict, model_path) -> None:
    specs = {spec["name"]: spec for spec in metadata["inputs"]}
    logged = {name: (dtype, shape) for name, dtype, shape in _input_specs(log)}
    logged["y"] = (log.header.get("y", {}).get("dtype"), list(log.header.get("y", {}).get("shape", [])))
    for name in [spec["name"] for spec in metadata["inputs"]]:
        dtype, shape = logged.get(name, (None, None))
        if dtype != specs[name]["dtype"] or shape != list(specs[name]["shape"][1:]):
            raise LogError(f"{log.path} holds {name} as {dtype} {shape} per sample, but {model_path} takes "
                           f"{specs[name]['dtype']} {specs[name]['shape'][1:]}: is this the model it was written for?")


def _rows(rows: List[bytes], dtype: str, shape: List[int]):
    import torch

    array = np.frombuffer(b"".join(rows), dtype=_NUMPY[dtype]).reshape(len(rows), *shape)
    return torch.from_numpy(array.astype(array.dtype.newbyteorder("="), copy=True))


def _inputs(rows: List[bytes], specs: List[Tuple[str, str, List[int]]]):
    """One micro-batch's inputs from its events' x bytes: a tensor, or a dict by name (several inputs)."""
    if len(specs) == 1 and specs[0][0] == "x":
        return _rows(rows, specs[0][1], specs[0][2])
    batch, at = {}, 0
    for name, dtype, shape in specs:
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NUMPY[dtype]).itemsize
        batch[name] = _rows([row[at:at + size] for row in rows], dtype, shape)
        at += size
    return batch


def _draws_seed(log: FeedbackLog, metadata: dict) -> int | None:
    """The run's seed of dropout's draws (the log header's ``seed``), or None: a module that draws nothing, or a
    log written before micro-batches were seeded."""
    draws = metadata.get(protocol.CAPTURE_KEY, {}).get(protocol.DRAWS_RANDOM_KEY, True)
    seed = log.header.get("seed")
    return int(seed) if draws and seed is not None else None


def _guarded_step(reference, x, y, names: List[str], max_grad_norm: float,
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
        loss = reference.loss(reference.forward(reference.model, x), y)
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


class _Gate:
    """The publish gate as the Java learner runs it (dev.gradbridge.online.Gate, Publisher): the gate
    data's loss in eval mode, one evaluate over the whole file; published when at most the serving
    version's plus max_regression; the published versions kept (the last keep_versions), and under
    the rollback policy the learner's state with each."""

    def __init__(self, log: FeedbackLog, settings: dict, metadata: dict, reference, gate_data) -> None:
        from ._runtime import data, inputs

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
                self.x, self.y = inputs.to_torch(x), inputs.to_torch(y)
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


@dataclass
class KafkaSource:
    """The topic a Kafka-fed log read, as ``gradbridge serve`` took it (``--kafka-bootstrap``, ``--kafka-topic``,
    ``--kafka-properties``)."""

    bootstrap: str
    topic: str
    properties: str | os.PathLike | None = None


def replay(log_dir: str | os.PathLike, model_path: str | os.PathLike, model=None, *,
           keep_parameters: bool = False, gate_data: str | os.PathLike | None = None,
           from_kafka: KafkaSource | None = None) -> ReplayReport:
    """Apply the logged micro-batches to ``model_path``'s initial tensors with eager torch.optim and
    compare every logged version and quarantine; ``model`` (an eager nn.Module) as for
    ``reference.Reference``. ``keep_parameters`` keeps each version's replayed parameters (and trained buffers) in
    ``report.parameters``. A gated log's decisions are taken again: with the gate data (``gate_data``,
    else the file the log's header names when it is still the same) both gate losses are computed
    again and compared bit for bit; without it the logged losses decide. LogError on the conditions
    the Java learner refuses to start on: a damaged record, a log or checkpoint of another model, a
    log that contradicts the checkpoint. With ``from_kafka`` the events the log learned from that topic are read
    again from the topic (the offsets its ``S``/``P`` records name) and replayed instead of the logged ones; a topic
    that does not hold the same records is a LogError naming the partition and offset."""
    from .reference import Reference

    if not Path(model_path).is_file():
        raise LogError(f"no training module at {model_path}")
    log = read_log(log_dir)
    sha = file_sha256(model_path)
    if log.header.get("model_sha256") != sha:
        raise LogError(f"{log.path}: offset 0: it was written for the module with SHA-256 {log.header.get('model_sha256')}"
                       f" ({log.header.get('model')}), not {sha} ({model_path})")
    check_checkpoint(log, log_dir, sha)
    metadata = protocol.read_metadata(model_path)
    _check_header(log, metadata, model_path)
    input_specs = _input_specs(log)
    from_topic = {}
    if from_kafka is not None:
        from . import kafka_topic

        wanted = kafka_topic.ranges(log, from_kafka.topic)
        records = kafka_topic.read_records(from_kafka.bootstrap, from_kafka.topic, from_kafka.properties, wanted)
        from_topic = kafka_topic.events(log, from_kafka.topic, records, input_specs)
        log.events = {**log.events, **from_topic}
    reference = Reference(model_path, model)
    names = [spec["name"] for spec in metadata["parameters"]]
    # a version holds the buffers training writes too (BatchNorm's statistics), after the parameters
    trained = [spec["name"] for spec in metadata["buffers"] if spec.get("trained", True)]
    dtypes = {spec["name"]: spec["dtype"] for spec in metadata["parameters"] + metadata["buffers"]}
    max_norm = float(log.header.get("max_grad_norm") or 0.0)
    run_seed = _draws_seed(log, metadata)
    versions = {v.updates: v for v in log.versions}
    rows: List[VersionRow] = []
    kept: Dict[int, Dict[str, object]] = {}
    updates, events, loss, quarantined = 0, 0, float("nan"), 0
    next_seq = int(log.header.get("first_seq", 0))
    gate = None if log.header.get("gate") is None else _Gate(log, log.header["gate"], metadata, reference, gate_data)
    gates: List[GateRow] = []
    undecided = None  # with a gate: the version just reached, until its decision
    rollbacks = 0
    serving = 0

    def check_version() -> None:
        nonlocal undecided
        version = versions.get(updates)
        if version is None:
            return
        buffers = reference.buffers() if trained else {}
        values = {**reference.parameters(), **{name: buffers[name] for name in trained}}
        if keep_parameters:
            kept[version.id] = values
        mine = {name: digest(values[name].numpy(), dtypes[name]) for name in names + trained}
        rows.append(VersionRow(version.id, updates, events, version.loss, loss,
                               _combined(version.digests, names + trained), _combined(mine, names + trained)))
        undecided = version.id if gate is not None and version.id > 0 else None

    check_version()
    if gate is not None:
        gate.start(rows[0].version if rows else 0, next((r for r in log.order if isinstance(r, Gate)), None))
    refused = None  # (batch, reason) the replay refused: its quarantine record must follow
    for record in log.order:
        if isinstance(record, Gate):
            if gate is None or record.version != undecided:
                raise LogError(f"{log.path}: offset {record.offset}: a gate decision on version {record.version}, which "
                               + ("a learner without a publish gate never writes" if gate is None
                                  else "is not the version just logged"))
            mine = gate.loss()
            mine = record.loss if mine is None else mine
            decision = gate.decision(mine)
            gates.append(GateRow(record.version, record.serving, gate.kept[-1][0], record.loss, mine, record.serving_loss,
                                 gate.kept[-1][1], record.decision, decision))
            gate.apply(record.version, record.loss, record.decision)  # as logged: later checks stay meaningful
            undecided = None
            continue
        if isinstance(record, Rollback):
            if gate is None or undecided is not None:
                raise LogError(f"{log.path}: offset {record.offset}: a rollback to version {record.version}, which "
                               + ("a learner without a publish gate never writes" if gate is None
                                  else "comes before the gate decision on the version just logged"))
            gate.roll_back(record)
            rollbacks += 1
            continue
        if isinstance(record, Quarantine):
            if refused is None or refused[0].first_seq != record.first_seq:
                raise LogError(f"{log.path}: offset {record.offset}: quarantines the micro-batch from event "
                               f"{record.first_seq}, which applies cleanly when replayed")
            refused = None
            quarantined += 1
            continue
        if not isinstance(record, Batch):
            continue
        batch = record
        if refused is not None:
            raise LogError(f"{log.path}: offset {refused[0].offset}: the micro-batch from event {refused[0].first_seq} "
                           f"is refused when replayed ({refused[1]}) but the log has no quarantine for it")
        if undecided is not None:
            raise LogError(f"{log.path}: offset {batch.offset}: a micro-batch before the gate decision on version "
                           f"{undecided}")
        floor = int(log.header.get("seq_floor", 0))
        if next_seq < floor and batch.first_seq == floor and not any(next_seq <= s < floor for s in log.events):
            next_seq = floor  # a recovered log: the numbers below the floor are gone for good
        if batch.index != updates or batch.first_seq != next_seq:
            raise LogError(f"{log.path}: offset {batch.offset}: micro-batch {batch.index} starts at event "
                           f"{batch.first_seq}; expected micro-batch {updates} from event {next_seq}")
        seqs = range(batch.first_seq, batch.first_seq + batch.count)
        missing = [seq for seq in seqs if seq not in log.events]
        if missing:
            raise LogError(f"{log.path}: offset {batch.offset}: micro-batch {batch.index} names event {missing[0]}, "
                           "which the log does not hold")
        x = _inputs([log.events[seq][0] for seq in seqs], input_specs)
        y = _rows([log.events[seq][1] for seq in seqs], log.header["y"]["dtype"], log.header["y"]["shape"])
        step_seed = None if run_seed is None else shuffle.step_seed(run_seed, batch.first_seq)
        step_loss, reason = _guarded_step(reference, x, y, names, max_norm, step_seed)
        next_seq += batch.count
        if reason is not None:
            refused = (batch, reason)
            continue
        loss = step_loss
        updates += 1
        events += batch.count
        check_version()
    if refused is not None:
        quarantined += 1  # the last micro-batch: the learner appends its quarantine when it restarts
    unapplied = sum(1 for seq in log.events if seq >= next_seq)
    if gate is not None:
        serving = gate.kept[-1][0]
    elif rows:
        serving = rows[-1].version
    return ReplayReport(str(model_path), str(log.path), rows, updates, events, unapplied, log.torn_bytes, kept,
                        quarantined, gates, gate is not None and gate.checks_losses, rollbacks, serving, len(from_topic))


def recover(log_dir: str | os.PathLike, into: str | os.PathLike) -> dict:
    """Copy the whole, checked records of a damaged log up to its first bad frame into a new log
    folder ``into`` (which must not exist): a consistent prefix the service resumes from, replaying
    it from the exported module. The new header's ``seq_floor`` lies above every sequence number the
    damaged log may have used (the largest readable one, plus one per event that could fit in the
    unreadable bytes), so numbers are never reused. Returns what was kept and dropped."""
    path = Path(log_dir) / FILE_NAME
    target = Path(into)
    if target.exists():
        raise LogError(f"{target} exists; recover-log writes a new folder")
    if not path.is_file():
        raise LogError(f"no feedback log at {path}")
    data = path.read_bytes()
    kept: List[Tuple[int, bytes]] = []
    bad_offset, reason = None, None
    try:
        for offset, payload in frames(path, data):
            kept.append((offset, payload))
    except LogError as ex:
        reason = str(ex)
        bad_offset = kept[-1][0] + FRAME_HEADER + len(kept[-1][1]) if kept else 0
    if not kept or kept[0][1][:1] != b"H":
        raise LogError(f"{path}: the header record is damaged; nothing can be recovered")
    header = json.loads(kept[0][1][1:].decode("utf-8"))
    specs = [(spec["shape"], spec["dtype"]) for spec in header.get("inputs", [header["x"]])] + [(header["y"]["shape"],
                                                                                                 header["y"]["dtype"])]
    event_frame = FRAME_HEADER + 17 + sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(_NUMPY[dtype]).itemsize
                                          for shape, dtype in specs)
    max_seq = max([struct.unpack_from("<q", p, 1)[0] for _, p in kept if p[:1] == b"E"] or [-1])
    unreadable = 0
    if bad_offset is not None:  # resynchronise on frames after the damage, for their sequence numbers
        offset = bad_offset
        while offset + FRAME_HEADER <= len(data):
            length, crc, head_crc = struct.unpack_from("<III", data, offset)
            end = offset + FRAME_HEADER + length
            if crc32c(data[offset:offset + 8]) == head_crc and 1 <= length <= MAX_PAYLOAD and end <= len(data) \
                    and crc32c(data[offset + FRAME_HEADER:end]) == crc:
                payload = data[offset + FRAME_HEADER:end]
                if payload[:1] == b"E":
                    max_seq = max(max_seq, struct.unpack_from("<q", payload, 1)[0])
                offset = end
            else:
                unreadable += 1
                offset += 1
        unreadable += len(data) - offset
    header["seq_floor"] = int(max(header.get("seq_floor", 0), max_seq + 1 + -(-unreadable // event_frame)))
    target.mkdir(parents=True)
    with open(target / FILE_NAME, "wb") as out:
        out.write(frame(b"H" + json.dumps(header).encode("utf-8")))
        for _, payload in kept[1:]:
            out.write(frame(payload))
        out.flush()
        os.fsync(out.fileno())
    return {"kept_records": len(kept) - 1, "bad_offset": bad_offset, "reason": reason, "seq_floor": header["seq_floor"],
            "dropped_bytes": len(data) - (bad_offset if bad_offset is not None else len(data))}
