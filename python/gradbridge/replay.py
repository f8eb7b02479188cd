"""Replay an online learner's feedback log with eager PyTorch and check every published version.

``dev.gradbridge.online.OnlineLearner`` (Java) logs every accepted feedback event, every
micro-batch before it is applied and every published version with SHA-256 digests of its
parameters (format: ``dev.gradbridge.online.FeedbackLog``). ``replay`` starts from the exported
module's initial tensors, applies the logged micro-batches in order with ``reference.Reference``
(torch.optim, eager autograd) and compares each logged version's digests and loss with its own:
equal digests mean bitwise equal parameters.

Framing, little-endian: ``u32 length, u32 crc32(payload), payload``; the payload's first byte is
its type (``H`` header JSON, ``E`` event, ``B`` micro-batch, ``V`` version). A record cut short
or failing its checksum ends the log (a torn tail, reported, not an error).
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from . import protocol
from .errors import GradbridgeError
from .history import digest

FILE_NAME = "feedback.log"
FORMAT = "gradbridge-feedback-log"
FORMAT_VERSION = 1
_MAX_PAYLOAD = 64 << 20
_NUMPY = {"float32": "<f4", "float64": "<f8", "int64": "<i8"}


class LogError(GradbridgeError):
    """A feedback log that cannot be replayed: missing, not a log, malformed, or not for this model."""


@dataclass
class Batch:
    index: int
    first_seq: int
    count: int


@dataclass
class Version:
    id: int
    updates: int
    loss: float
    digests: Dict[str, str]


@dataclass
class FeedbackLog:
    """A parsed log: header, events by sequence number, micro-batches and versions in file order."""

    path: Path
    header: dict
    events: Dict[int, Tuple[bytes, bytes]] = field(default_factory=dict)
    batches: List[Batch] = field(default_factory=list)
    versions: List[Version] = field(default_factory=list)
    torn_bytes: int = 0


def _frames(data: bytes):
    """(offset, payload) of each whole frame; stops at the end or at a torn or corrupt frame."""
    offset = 0
    while offset + 8 <= len(data):
        length, crc = struct.unpack_from("<II", data, offset)
        end = offset + 8 + length
        if length < 1 or length > _MAX_PAYLOAD or end > len(data):
            return
        payload = data[offset + 8:end]
        if zlib.crc32(payload) != crc:
            return
        yield offset, payload
        offset = end


def read_log(log_dir: str | os.PathLike) -> FeedbackLog:
    """Parse ``log_dir/feedback.log``; LogError (one line) when it is missing or not a valid log."""
    path = Path(log_dir) / FILE_NAME
    if not path.is_file():
        raise LogError(f"no feedback log at {path}" + (" (the folder does not exist)" if not Path(log_dir).is_dir() else ""))
    data = path.read_bytes()
    frames = _frames(data)
    first = next(frames, None)
    if first is None or first[1][:1] != b"H":
        raise LogError(f"{path} is not a gradbridge feedback log (no header record)")
    try:
        header = json.loads(first[1][1:].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as ex:
        raise LogError(f"{path}: the header record is not valid JSON ({ex})") from ex
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != FORMAT_VERSION:
        raise LogError(f"{path}: header says format {header.get('format')!r} version {header.get('version')!r}; "
                       f"expected {FORMAT} version {FORMAT_VERSION}")
    log = FeedbackLog(path, header)
    end = first[0] + 8 + len(first[1])
    for offset, payload in frames:
        end = offset + 8 + len(payload)
        kind = payload[:1]
        try:
            if kind == b"E":
                seq, n = struct.unpack_from("<qI", payload, 1)
                x = payload[13:13 + n]
                (m,) = struct.unpack_from("<I", payload, 13 + n)
                y = payload[17 + n:17 + n + m]
                if len(x) != n or len(y) != m or 17 + n + m != len(payload):
                    raise ValueError("lengths do not add up")
                log.events[seq] = (x, y)
            elif kind == b"B":
                index, first_seq, count = struct.unpack_from("<qqI", payload, 1)
                log.batches.append(Batch(index, first_seq, count))
            elif kind == b"V":
                vid, updates, loss = struct.unpack_from("<qqd", payload, 1)
                log.versions.append(Version(vid, updates, loss, json.loads(payload[25:].decode("utf-8"))))
            else:
                raise ValueError(f"unknown record type {kind!r}")
        except (struct.error, ValueError, UnicodeDecodeError) as ex:
            raise LogError(f"{path}: record at offset {offset} is malformed ({ex})") from ex
    log.torn_bytes = len(data) - end
    return log


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
    #: version id -> parameters by name (only with ``keep_parameters=True``)
    parameters: Dict[int, Dict[str, "object"]] = field(default_factory=dict)

    @property
    def bitwise(self) -> bool:
        return bool(self.rows) and all(row.match for row in self.rows)

    def verdict(self) -> str:
        if self.bitwise:
            return (f"bitwise identical: {len(self.rows)} versions, {self.batches} micro-batches, "
                    f"{self.events} events")
        if not self.rows:
            return "no versions in the log"
        bad = next(row for row in self.rows if not row.match)
        return (f"differs at version {bad.version} ({bad.updates} updates): loss {bad.loss_java!r} (java) vs "
                f"{bad.loss_python!r} (python), digest {bad.digest_java[:16]} vs {bad.digest_python[:16]}")

    def table(self) -> str:
        lines = [f"{'version':>7}  {'updates':>7}  {'events':>7}  {'loss java':>15}  {'loss python':>15}  "
                 f"{'digest java':<16}  {'digest python':<16}  match"]
        for r in self.rows:
            lines.append(f"{r.version:>7}  {r.updates:>7}  {r.events:>7}  {r.loss_java:>15.9g}  {r.loss_python:>15.9g}  "
                         f"{r.digest_java[:16]:<16}  {r.digest_python[:16]:<16}  {'yes' if r.match else 'NO'}")
        lines.append(f"python replay: {self.verdict()}")
        return "\n".join(lines)


def _combined(digests: Dict[str, str], names: List[str]) -> str:
    """One digest over the parameters' digests in protocol order (short to print, exact to compare)."""
    import hashlib

    return hashlib.sha256(",".join(digests.get(name, "?") for name in names).encode()).hexdigest()


def _check_header(log: FeedbackLog, metadata: dict, model_path) -> None:
    for name in ("x", "y"):
        spec = next(s for s in metadata["inputs"] if s["name"] == name)
        logged = log.header.get(name, {})
        if logged.get("dtype") != spec["dtype"] or list(logged.get("shape", [])) != list(spec["shape"][1:]):
            raise LogError(f"{log.path} holds {name} as {logged.get('dtype')} {logged.get('shape')} per sample, but "
                           f"{model_path} takes {spec['dtype']} {spec['shape'][1:]}: is this the model it was written for?")


def _rows(rows: List[bytes], dtype: str, shape: List[int]):
    import torch

    array = np.frombuffer(b"".join(rows), dtype=_NUMPY[dtype]).reshape(len(rows), *shape)
    return torch.from_numpy(array.astype(array.dtype.newbyteorder("="), copy=True))


def replay(log_dir: str | os.PathLike, model_path: str | os.PathLike, model=None, *,
           keep_parameters: bool = False) -> ReplayReport:
    """Apply the logged micro-batches to ``model_path``'s initial tensors with eager torch.optim and
    compare every logged version; ``model`` (an eager nn.Module) as for ``reference.Reference``.
    ``keep_parameters`` keeps each version's replayed parameters in ``report.parameters``."""
    from .reference import Reference

    if not Path(model_path).is_file():
        raise LogError(f"no training module at {model_path}")
    log = read_log(log_dir)
    metadata = protocol.read_metadata(model_path)
    _check_header(log, metadata, model_path)
    reference = Reference(model_path, model)
    names = [spec["name"] for spec in metadata["parameters"]]
    dtypes = {spec["name"]: spec["dtype"] for spec in metadata["parameters"]}
    versions = {v.updates: v for v in log.versions}
    rows: List[VersionRow] = []
    kept: Dict[int, Dict[str, object]] = {}
    updates, next_seq, events, loss = 0, 0, 0, float("nan")

    def check_version() -> None:
        version = versions.get(updates)
        if version is None:
            return
        params = reference.parameters()
        if keep_parameters:
            kept[version.id] = params
        mine = {name: digest(params[name].numpy(), dtypes[name]) for name in names}
        rows.append(VersionRow(version.id, updates, events, version.loss, loss,
                               _combined(version.digests, names), _combined(mine, names)))

    check_version()
    for batch in log.batches:
        if batch.index != updates or batch.first_seq != next_seq:
            raise LogError(f"{log.path}: micro-batch {batch.index} starts at event {batch.first_seq}; expected "
                           f"micro-batch {updates} from event {next_seq}")
        seqs = range(batch.first_seq, batch.first_seq + batch.count)
        missing = [seq for seq in seqs if seq not in log.events]
        if missing:
            raise LogError(f"{log.path}: micro-batch {batch.index} names event {missing[0]}, which the log does not hold")
        x = _rows([log.events[seq][0] for seq in seqs], log.header["x"]["dtype"], log.header["x"]["shape"])
        y = _rows([log.events[seq][1] for seq in seqs], log.header["y"]["dtype"], log.header["y"]["shape"])
        loss = float(reference.train_step(x, y))
        updates += 1
        next_seq += batch.count
        events += batch.count
        check_version()
    unapplied = sum(1 for seq in log.events if seq >= next_seq)
    return ReplayReport(str(model_path), str(log.path), rows, updates, events, unapplied, log.torn_bytes, kept)
