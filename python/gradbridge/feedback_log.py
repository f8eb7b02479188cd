"""The online learner's feedback log as Python reads it: the framing, the records, a strict reader.

``dev.gradbridge.online.OnlineLearner`` (Java) writes it; ``gradbridge.replay`` replays it with eager PyTorch;
tests/test_pins.py ties this module's constants and checksum to ``dev.gradbridge.online.LogFormat``.

Framing, little-endian: ``u32 length, u32 crc32c(payload), u32 crc32c(the 8 bytes before)``, then the
payload, whose first byte is its type (``H`` header JSON, ``W`` the start of one request's write, with the length
in bytes of the events and key that follow it in that write, ``E`` event, ``K`` idempotency key, ``B`` micro-batch,
``Q`` quarantined micro-batch, ``V`` version, ``G`` a publish gate's decision on the version before it, ``R`` an
operator's rollback of predictions to an earlier version, ``S`` the offsets of an external source such as a Kafka
topic that one read consumed, first in its write and followed by that read's events and keys, whose length in bytes
it carries; ``P`` the same offsets after their events, in logs of earlier versions: replay needs only the events and
batches, so it ignores them; tests check that they cover the source without gap or overlap). Only an incomplete last
frame, or a last ``S`` or ``W`` record whose write is not all in the file (a torn tail, with what there is of its
write), may end the log early, so a request or a read is in the log whole or not at all; any other frame that does
not check is an error naming its offset, as in Java. Logs of earlier versions hold no ``W``: their requests read as
before.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .errors import LogError

FILE_NAME = "feedback.log"
CHECKPOINT_FILE = "checkpoint.json"
FORMAT = "gradbridge-feedback-log"
FORMAT_VERSION = 2
FRAME_HEADER = 12
MAX_PAYLOAD = 64 << 20
#: record types (the payload's first byte)
RECORD_TYPES = {"header": b"H", "request": b"W", "event": b"E", "key": b"K", "batch": b"B", "quarantine": b"Q",
                "version": b"V", "position": b"P", "sourced": b"S", "gate": b"G", "rollback": b"R"}
#: a P record's item status: the record's events were logged / answered from an earlier key / refused
POSITION_LOGGED, POSITION_DUPLICATE, POSITION_REFUSED = 0, 1, 2
#: a G record's decision: the version was published / held back / held back and the learner rolled back
GATE_PUBLISHED, GATE_HELD, GATE_ROLLED_BACK = 0, 1, 2
#: the header's gate ``on_hold`` policies
HOLD_POLICIES = ("continue", "rollback")


def _crc_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as ``java.util.zip.CRC32C``."""
    crc = 0xFFFFFFFF
    table = _CRC32C
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@dataclass
class Batch:
    index: int
    first_seq: int
    count: int
    offset: int = 0


@dataclass
class Quarantine:
    index: int
    first_seq: int
    count: int
    reason: str
    offset: int = 0


@dataclass
class Version:
    id: int
    updates: int
    loss: float
    digests: Dict[str, str]
    offset: int = 0


@dataclass
class Gate:
    """A publish gate's decision on the version just logged: both gate losses and the decision."""
    version: int
    serving: int
    loss: float
    serving_loss: float
    decision: int
    offset: int = 0


@dataclass
class Rollback:
    """Predictions returned to ``version`` (from ``previous``) by an operator."""
    version: int
    previous: int
    offset: int = 0


@dataclass
class Position:
    """One read of an external source: per partition the offsets [from, to) it consumed, and per record
    (partition, offset, first_seq, count, status); ``following``: bytes of the frames after it that complete
    its write (an ``S`` record), -1 for a ``P`` record (after its events)."""
    source: str
    ranges: List[Tuple[int, int, int]]
    items: List[Tuple[int, int, int, int, int]]
    offset: int = 0
    following: int = -1


@dataclass
class FeedbackLog:
    """A parsed log: header, events by sequence number, keys, and batches, quarantines and versions in file order."""

    path: Path
    header: dict
    events: Dict[int, Tuple[bytes, bytes]] = field(default_factory=dict)
    keys: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    batches: List[Batch] = field(default_factory=list)
    quarantines: List[Quarantine] = field(default_factory=list)
    versions: List[Version] = field(default_factory=list)
    order: List[object] = field(default_factory=list)  #: batches, quarantines, versions, gates, rollbacks in file order
    positions: List[Position] = field(default_factory=list)  #: reads of external sources, in file order
    end: int = 0
    torn_bytes: int = 0


def frames(path: Path, data: bytes):
    """(offset, payload) of each frame; stops at a torn tail (an incomplete last frame) and
    raises LogError naming the offset for anything else that does not check."""
    offset = 0
    while offset < len(data):
        if len(data) - offset < FRAME_HEADER:
            return
        length, crc, head_crc = struct.unpack_from("<III", data, offset)
        if offset == 0 and (crc32c(data[:8]) != head_crc or not 1 <= length <= MAX_PAYLOAD):
            raise LogError(f"{path} is not a gradbridge feedback log (no header record)")
        if crc32c(data[offset:offset + 8]) != head_crc:
            raise LogError(f"{path}: offset {offset}: the frame header's checksum does not match (damaged, not a torn tail)")
        if length < 1 or length > MAX_PAYLOAD:
            raise LogError(f"{path}: offset {offset}: frame length {length} is outside 1..{MAX_PAYLOAD}")
        end = offset + FRAME_HEADER + length
        if end > len(data):
            return
        payload = data[offset + FRAME_HEADER:end]
        if crc32c(payload) != crc:
            raise LogError(f"{path}: offset {offset}: the record's checksum does not match")
        yield offset, payload
        offset = end


def frame(payload: bytes) -> bytes:
    """One frame around ``payload`` (the writer's framing, for tools and tests)."""
    head = struct.pack("<II", len(payload), crc32c(payload))
    return head + struct.pack("<I", crc32c(head)) + payload


def read_log(log_dir: str | os.PathLike) -> FeedbackLog:
    """Parse ``log_dir/feedback.log`` strictly; LogError (one line, with the offset) when it is
    missing, damaged before its end or not a feedback log. A torn tail is reported, not an error."""
    path = Path(log_dir) / FILE_NAME
    if not path.is_file():
        raise LogError(f"no feedback log at {path}" + (" (the folder does not exist)" if not Path(log_dir).is_dir() else ""))
    data = path.read_bytes()
    records = frames(path, data)
    first = next(records, None)
    log = FeedbackLog(path, _header(path, first))
    end = FRAME_HEADER + len(first[1])
    write_start, write_end = -1, -1  # the last S or W record, which begins a write, and that write's end
    for offset, payload in records:
        if offset < write_end < offset + FRAME_HEADER + len(payload):
            raise LogError(_inside_frame(path, offset, write_start, write_end))
        kind = payload[:1]
        if kind in (b"S", b"W"):
            read = _position(path, offset, payload) if kind == b"S" else None
            following = read.following if read is not None else _request_following(path, offset, payload)
            if offset + FRAME_HEADER + len(payload) + following > len(data):
                break  # torn: the write this record begins did not reach the file whole
            write_start, write_end = offset, offset + FRAME_HEADER + len(payload) + following
            if read is not None:
                log.positions.append(read)
            end = offset + FRAME_HEADER + len(payload)
            continue
        end = offset + FRAME_HEADER + len(payload)
        _add_record(log, path, offset, payload)
    if end < write_end:
        raise LogError(_inside_frame(path, end, write_start, write_end))
    log.end = end
    log.torn_bytes = len(data) - end
    return log


def _header(path: Path, first) -> Dict[str, Any]:
    """The log's header record (``first``: the first frame, or None), checked to be a feedback log's
    of this format version."""
    if first is None or first[1][:1] != b"H":
        raise LogError(f"{path} is not a gradbridge feedback log (no header record)")
    try:
        header = json.loads(first[1][1:].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as ex:
        raise LogError(f"{path}: offset 0: the header record is not valid JSON") from ex
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != FORMAT_VERSION:
        raise LogError(f"{path}: offset 0: header says format {header.get('format')!r} version {header.get('version')!r}; "
                       f"expected {FORMAT} version {FORMAT_VERSION}")
    return header


def _add_record(log: FeedbackLog, path: Path, offset: int, payload: bytes) -> None:
    """Parse one record that is not a write's start (E, K, B, Q, V, G, R, P) into ``log``; LogError
    with its offset when it is malformed."""
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
        elif kind == b"K":
            first_seq, count = struct.unpack_from("<qI", payload, 1)
            log.keys[payload[45:].decode("utf-8")] = (first_seq, count)
        elif kind == b"B":
            if len(payload) != 21:
                raise ValueError("lengths do not add up")
            batch = Batch(*struct.unpack_from("<qqI", payload, 1), offset=offset)
            log.batches.append(batch)
            log.order.append(batch)
        elif kind == b"Q":
            index, first_seq, count = struct.unpack_from("<qqI", payload, 1)
            quarantine = Quarantine(index, first_seq, count, payload[21:].decode("utf-8"), offset=offset)
            log.quarantines.append(quarantine)
            log.order.append(quarantine)
        elif kind == b"V":
            vid, updates, loss = struct.unpack_from("<qqd", payload, 1)
            version = Version(vid, updates, loss, json.loads(payload[25:].decode("utf-8")), offset=offset)
            log.versions.append(version)
            log.order.append(version)
        elif kind == b"G":
            if len(payload) != 34 or payload[33] > GATE_ROLLED_BACK:
                raise ValueError("lengths do not add up")
            gate = Gate(*struct.unpack_from("<qqddB", payload, 1), offset=offset)
            log.order.append(gate)
        elif kind == b"R":
            if len(payload) != 17:
                raise ValueError("lengths do not add up")
            log.order.append(Rollback(*struct.unpack_from("<qq", payload, 1), offset=offset))
        elif kind == b"P":
            log.positions.append(_position(path, offset, payload))
        else:
            raise ValueError(f"unknown record type {kind!r}")
    except (struct.error, ValueError, UnicodeDecodeError) as ex:
        raise LogError(f"{path}: offset {offset}: the record is malformed ({ex})") from ex


def _position(path: Path, offset: int, payload: bytes) -> Position:
    """A P or S record's fields (S: the length of the rest of its write after them)."""
    try:
        (n,) = struct.unpack_from("<H", payload, 1)
        source = payload[3:3 + n].decode("utf-8")
        at = 3 + n
        (count,) = struct.unpack_from("<I", payload, at)
        ranges = [struct.unpack_from("<iqq", payload, at + 4 + 20 * i) for i in range(count)]
        at += 4 + 20 * count
        (count,) = struct.unpack_from("<I", payload, at)
        items = [struct.unpack_from("<iqqIb", payload, at + 4 + 25 * i) for i in range(count)]
        at += 4 + 25 * count
        following = -1
        if payload[:1] == b"S":
            (following,) = struct.unpack_from("<q", payload, at)
            at += 8
            if following < 0:
                raise ValueError("a negative length")
        if at != len(payload):
            raise ValueError("lengths do not add up")
    except (struct.error, ValueError, UnicodeDecodeError) as ex:
        raise LogError(f"{path}: offset {offset}: the record is malformed ({ex})") from ex
    return Position(source, ranges, items, offset=offset, following=following)


def _request_following(path: Path, offset: int, payload: bytes) -> int:
    """A W record's length of the rest of its write."""
    following = struct.unpack_from("<q", payload, 1)[0] if len(payload) == 9 else -1
    if following < 0:
        raise LogError(f"{path}: offset {offset}: the record is malformed (lengths do not add up)")
    return following


def _inside_frame(path: Path, offset: int, write_start: int, write_end: int) -> str:
    return (f"{path}: offset {offset}: the write that the record at offset {write_start} begins ends inside this frame "
            f"(at offset {write_end}; damaged, not a torn tail)")


def check_checkpoint(log: FeedbackLog, log_dir, model_sha256: str) -> None:
    """LogError when the folder's checkpoint.json belongs to another model or the log contradicts it."""
    path = Path(log_dir) / CHECKPOINT_FILE
    if not path.is_file():
        return
    try:
        checkpoint = json.loads(path.read_text())
        version, updates, scan = checkpoint["version"], checkpoint["updates"], checkpoint["scan_offset"]
    except (ValueError, KeyError, TypeError) as ex:
        raise LogError(f"{path} is not a valid checkpoint descriptor") from ex
    if checkpoint.get("model_sha256") != model_sha256:
        raise LogError(f"{path} belongs to the module with SHA-256 {checkpoint.get('model_sha256')}, not {model_sha256}")
    if log.end < scan:
        raise LogError(f"{log.path} ends at offset {log.end} but {path} resumes at offset {scan}: the log was cut or replaced")
    logged = next((v for v in log.versions if v.id == version), None)
    if logged is None:
        raise LogError(f"{log.path} does not hold version {version}, which {path} checkpoints: the log was cut or replaced")
    if logged.updates != updates or logged.digests != checkpoint.get("digests"):
        raise LogError(f"{log.path}: offset {logged.offset}: version {version} differs from the one {path} holds")


def file_sha256(path) -> str:
    """SHA-256 of a file (the module's identity in the log's header and checkpoint)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()
