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
from .replay_learner import PublishGate, guarded_step

#: numpy's dtype of each input dtype's bytes in the log (a bfloat16 value's 2-byte word read as int16, then viewed)
_NUMPY = {"float32": "<f4", "float64": "<f8", "int64": "<i8", "float16": "<f2", "bfloat16": "<i2"}


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
    tensor = torch.from_numpy(array.astype(array.dtype.newbyteorder("="), copy=True))
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


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

    log, metadata = _open(log_dir, model_path)
    input_specs = _input_specs(log)
    from_topic = {}
    if from_kafka is not None:
        from . import kafka_topic

        wanted = kafka_topic.ranges(log, from_kafka.topic)
        records = kafka_topic.read_records(from_kafka.bootstrap, from_kafka.topic, from_kafka.properties, wanted)
        from_topic = kafka_topic.events(log, from_kafka.topic, records, input_specs)
        log.events = {**log.events, **from_topic}
    state = _Replay(log, metadata, Reference(model_path, model), input_specs, gate_data, keep_parameters)
    return state.run(str(model_path), len(from_topic))


def _open(log_dir, model_path) -> Tuple[FeedbackLog, dict]:
    """The log, read strictly and checked against the module and its checkpoint, and the module's metadata."""
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
    return log, metadata


class _Replay:
    """One pass of ``replay`` over a log, as the Java learner's ``Recovery`` makes it: the eager reference, what it
    has applied, and the rows it has compared so far."""

    def __init__(self, log: FeedbackLog, metadata: dict, reference, input_specs, gate_data, keep_parameters: bool):
        self.log, self.reference, self.input_specs, self.keep_parameters = log, reference, input_specs, keep_parameters
        self.names = [spec["name"] for spec in metadata["parameters"]]
        # A version holds what training changes (Java's Updater.versionOf): the parameters that train (every
        # parameter in modules exported before set_state), then the buffers training writes.
        self.versioned = [spec["name"] for spec in metadata["parameters"]
                          if spec.get("trainable", True) or protocol.SET_STATE not in metadata["methods"]]
        self.trained = [spec["name"] for spec in metadata["buffers"] if spec.get("trained", True)]
        self.dtypes = {spec["name"]: spec["dtype"] for spec in metadata["parameters"] + metadata["buffers"]}
        self.max_norm = float(log.header.get("max_grad_norm") or 0.0)
        self.run_seed = _draws_seed(log, metadata)
        self.versions = {v.updates: v for v in log.versions}
        self.rows: List[VersionRow] = []
        self.kept: Dict[int, Dict[str, object]] = {}
        self.updates, self.events, self.loss, self.quarantined = 0, 0, float("nan"), 0
        self.next_seq = int(log.header.get("first_seq", 0))
        self.gate = (None if log.header.get("gate") is None
                     else PublishGate(log, log.header["gate"], metadata, reference, gate_data))
        self.gates: List[GateRow] = []
        self.undecided = None  # with a gate: the version just reached, until its decision
        self.rollbacks = 0
        self.refused = None  # (batch, reason) the replay refused: its quarantine record must follow

    def run(self, model: str, from_topic: int) -> ReplayReport:
        """Every record in log order, then the report."""
        log = self.log
        self.check_version()
        if self.gate is not None:
            self.gate.start(self.rows[0].version if self.rows else 0, next((r for r in log.order if isinstance(r, Gate)), None))
        for record in log.order:
            if isinstance(record, Gate):
                self.decide(record)
            elif isinstance(record, Rollback):
                self.roll_back(record)
            elif isinstance(record, Quarantine):
                self.quarantine(record)
            elif isinstance(record, Batch):
                self.batch(record)
        if self.refused is not None:
            self.quarantined += 1  # the last micro-batch: the learner appends its quarantine when it restarts
        unapplied = sum(1 for seq in log.events if seq >= self.next_seq)
        serving = self.gate.kept[-1][0] if self.gate is not None else self.rows[-1].version if self.rows else 0
        return ReplayReport(model, str(log.path), self.rows, self.updates, self.events, unapplied, log.torn_bytes,
                            self.kept, self.quarantined, self.gates, self.gate is not None and self.gate.checks_losses,
                            self.rollbacks, serving, from_topic)

    def check_version(self) -> None:
        """Compares the version logged at this many updates, if any, with the replay's parameters and buffers."""
        version = self.versions.get(self.updates)
        if version is None:
            return
        buffers = self.reference.buffers() if self.trained else {}
        values = {**self.reference.parameters(), **{name: buffers[name] for name in self.trained}}
        if self.keep_parameters:
            self.kept[version.id] = values
        names = self.versioned + self.trained
        mine = {name: digest(values[name], self.dtypes[name]) for name in names}
        self.rows.append(VersionRow(version.id, self.updates, self.events, version.loss, self.loss,
                                    _combined(version.digests, names), _combined(mine, names)))
        self.undecided = version.id if self.gate is not None and version.id > 0 else None

    def decide(self, record: Gate) -> None:
        """A gate decision: on the version just reached; taken again, then applied as logged."""
        gate = self.gate
        if gate is None or record.version != self.undecided:
            raise LogError(f"{self.log.path}: offset {record.offset}: a gate decision on version {record.version}, which "
                           + ("a learner without a publish gate never writes" if gate is None
                              else "is not the version just logged"))
        mine = gate.loss()
        mine = record.loss if mine is None else mine
        decision = gate.decision(mine)
        self.gates.append(GateRow(record.version, record.serving, gate.kept[-1][0], record.loss, mine, record.serving_loss,
                                  gate.kept[-1][1], record.decision, decision))
        gate.apply(record.version, record.loss, record.decision)  # as logged: later checks stay meaningful
        self.undecided = None

    def roll_back(self, record: Rollback) -> None:
        if self.gate is None or self.undecided is not None:
            raise LogError(f"{self.log.path}: offset {record.offset}: a rollback to version {record.version}, which "
                           + ("a learner without a publish gate never writes" if self.gate is None
                              else "comes before the gate decision on the version just logged"))
        self.gate.roll_back(record)
        self.rollbacks += 1

    def quarantine(self, record: Quarantine) -> None:
        if self.refused is None or self.refused[0].first_seq != record.first_seq:
            raise LogError(f"{self.log.path}: offset {record.offset}: quarantines the micro-batch from event "
                           f"{record.first_seq}, which applies cleanly when replayed")
        self.refused = None
        self.quarantined += 1

    def batch(self, batch: Batch) -> None:
        """A micro-batch: checked to be the next one, then the guarded step on its events."""
        self.check_batch(batch)
        log = self.log
        seqs = range(batch.first_seq, batch.first_seq + batch.count)
        x = _inputs([log.events[seq][0] for seq in seqs], self.input_specs)
        y = _rows([log.events[seq][1] for seq in seqs], log.header["y"]["dtype"], log.header["y"]["shape"])
        step_seed = None if self.run_seed is None else shuffle.step_seed(self.run_seed, batch.first_seq)
        step_loss, reason = guarded_step(self.reference, x, y, self.names, self.max_norm, step_seed)
        self.next_seq += batch.count
        if reason is not None:
            self.refused = (batch, reason)
            return
        self.loss = step_loss
        self.updates += 1
        self.events += batch.count
        self.check_version()

    def check_batch(self, batch: Batch) -> None:
        """After the last one's quarantine and gate decision, the next micro-batch, from the next event, all logged."""
        log = self.log
        if self.refused is not None:
            raise LogError(f"{log.path}: offset {self.refused[0].offset}: the micro-batch from event "
                           f"{self.refused[0].first_seq} is refused when replayed ({self.refused[1]}) but the log has no "
                           "quarantine for it")
        if self.undecided is not None:
            raise LogError(f"{log.path}: offset {batch.offset}: a micro-batch before the gate decision on version "
                           f"{self.undecided}")
        floor = int(log.header.get("seq_floor", 0))
        if self.next_seq < floor and batch.first_seq == floor and not any(self.next_seq <= s < floor for s in log.events):
            self.next_seq = floor  # a recovered log: the numbers below the floor are gone for good
        if batch.index != self.updates or batch.first_seq != self.next_seq:
            raise LogError(f"{log.path}: offset {batch.offset}: micro-batch {batch.index} starts at event "
                           f"{batch.first_seq}; expected micro-batch {self.updates} from event {self.next_seq}")
        missing = [seq for seq in range(batch.first_seq, batch.first_seq + batch.count) if seq not in log.events]
        if missing:
            raise LogError(f"{log.path}: offset {batch.offset}: micro-batch {batch.index} names event {missing[0]}, "
                           "which the log does not hold")


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
