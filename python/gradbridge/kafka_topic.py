"""`gradbridge replay --from-kafka`: the feedback a Kafka-fed log learned from, read again from the topic.

The records are read by the service's own Java client (``dev.gradbridge.serve.TopicRecords`` on
gradbridge-serve's classpath) with the same ``--kafka-properties`` file, so client and security settings mean
exactly what they mean to the service (a Python Kafka client takes another dialect of them: librdkafka's names,
no Java key stores or JAAS lines). Only the offsets the log's ``S``/``P`` records name are read. Each record the
log says was learned from is decoded here as the service decodes the JSON of ``/feedback`` (numbers read as
doubles and cast to the input's dtype, inputs in the header's order) and must give the log's events byte for
byte; anything else is one line naming the partition, offset and event.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from typing import Dict, List, Optional, Tuple

import numpy as np

from ._runtime import classpath, launcher
from .errors import LogError
from .feedback_log import POSITION_DUPLICATE, POSITION_LOGGED, FeedbackLog

TOPIC_MAIN = "dev.gradbridge.serve.TopicRecords"
_NUMPY = {"float32": "<f4", "float64": "<f8", "int64": "<i8"}


def _array(values, dtype: str) -> np.ndarray:
    """A field's numbers as the log holds them: a 16-bit input's float32 carrier as its dtype's words (the
    learner refuses, and never logs, a value that is not exactly one)."""
    if dtype == "bfloat16":
        return (np.asarray(values, dtype="<f4").view("<u4") >> 16).astype("<u2")
    if dtype == "float16":
        return np.asarray(values, dtype="<f4").astype("<f2")
    return np.asarray(values, dtype=_NUMPY[dtype])

Records = Dict[Tuple[int, int], Tuple[Optional[bytes], Optional[bytes]]]


def ranges(log: FeedbackLog, topic: str) -> Dict[int, Tuple[int, int]]:
    """{partition: (from, to)}: the offsets of ``topic`` the log read (contiguous: the writer refuses gaps)."""
    reads = [p for p in log.positions if p.source == topic]
    if not reads:
        sources = sorted({p.source for p in log.positions})
        raise LogError(f"{log.path} holds no read of Kafka topic '{topic}' (it read "
                       + (", ".join(f"'{s}'" for s in sources) if sources else "no topic: it was fed over HTTP only") + ")")
    covered: Dict[int, Tuple[int, int]] = {}
    for read in reads:
        for partition, start, stop in read.ranges:
            first, _ = covered.get(partition, (start, stop))
            covered[partition] = (min(first, start), stop)
    return covered


def read_records(bootstrap: str, topic: str, properties: str | os.PathLike | None,
                 wanted: Dict[int, Tuple[int, int]]) -> Records:
    """{(partition, offset): (key, value)} of ``topic`` in the ``wanted`` offset ranges, read by the service's client;
    LogError with the reader's one line when the broker, topic or properties file will not do."""
    args = [bootstrap, topic] + ([os.path.abspath(properties)] if properties is not None else [])
    line = launcher.command(TOPIC_MAIN, args, extra_classpath=classpath.resolve_serve())
    text = "".join(f"{p} {start} {stop}\n" for p, (start, stop) in sorted(wanted.items()))
    result = subprocess.run(line, input=text.encode(), capture_output=True, check=False)
    if result.returncode != 0:
        raise LogError(launcher.error_line(result.stderr.decode("utf-8", "replace"), result.returncode))
    data, at, records = result.stdout, 0, {}
    while True:
        (partition,) = struct.unpack_from(">i", data, at)
        if partition < 0:
            return records
        (offset,) = struct.unpack_from(">q", data, at + 4)
        at += 12
        fields = []
        for _ in range(2):
            (n,) = struct.unpack_from(">i", data, at)
            at += 4
            fields.append(None if n < 0 else data[at:at + n])
            at += max(n, 0)
        records[(partition, offset)] = (fields[0], fields[1])


def _decode(value: bytes, specs: List[Tuple[str, str, List[int]]], y_spec: Tuple[str, List[int]]) -> List[Tuple[bytes, bytes]]:
    """Each sample's (x bytes, y bytes) of a /feedback body, as the service logs them; ValueError when it is none."""
    body = json.loads(value.decode("utf-8"))
    x = body["x"]
    if len(specs) == 1 and specs[0][0] == "x":
        arrays = [_array(x, specs[0][1])]
    else:
        arrays = [_array(x[name], dtype) for name, dtype, _ in specs]
    y = _array(body["y"], y_spec[0])
    n = y.shape[0] if y.ndim else -1
    for array, (name, _, shape) in zip(arrays, specs):
        if list(array.shape) != [n, *shape]:
            raise ValueError(f"input '{name}' has shape {list(array.shape)}, not [{n}, {', '.join(map(str, shape))}]")
    if list(y.shape) != [n, *y_spec[1]]:
        raise ValueError(f"y has shape {list(y.shape)}")
    return [(b"".join(a[i].tobytes() for a in arrays), y[i].tobytes()) for i in range(n)]


def events(log: FeedbackLog, topic: str, records: Records,
           specs: List[Tuple[str, str, List[int]]]) -> Dict[int, Tuple[bytes, bytes]]:
    """{seq: (x bytes, y bytes)} of every event the log learned from ``topic``, from the topic's records; LogError
    (one line) where the topic does not hold what the log read: a record missing, feedback or a key that differs."""
    y_spec = (log.header["y"]["dtype"], list(log.header["y"]["shape"]))
    decoded: Dict[int, Tuple[bytes, bytes]] = {}
    for read in (p for p in log.positions if p.source == topic):
        for partition, offset, first_seq, count, status in read.items:
            where = f"Kafka topic '{topic}' partition {partition} offset {offset}"
            if (partition, offset) not in records:
                raise LogError(f"{where}: no such record, but the log read one there (offset {read.offset} of {log.path})")
            if status not in (POSITION_LOGGED, POSITION_DUPLICATE):
                continue  # refused: it gave no event
            key, value = records[(partition, offset)]
            logged_key = None if key is None else key.decode("utf-8", "replace")
            if status == POSITION_DUPLICATE or logged_key is not None:
                if logged_key is None or log.keys.get(logged_key) != (first_seq, count):
                    raise LogError(f"{where}: its key {logged_key!r} is not the one the log holds for events {first_seq}.."
                                   f"{first_seq + count - 1}: not the records the log learned from")
            try:
                rows = _decode(value or b"", specs, y_spec)
            except (ValueError, KeyError, TypeError, UnicodeDecodeError) as ex:
                raise LogError(f"{where}: not the feedback the log learned from (events {first_seq}.."
                               f"{first_seq + count - 1}): {ex}") from ex
            if len(rows) != count:
                raise LogError(f"{where}: {len(rows)} samples, but the log learned {count} from it (events {first_seq}.."
                               f"{first_seq + count - 1}): not the records the log learned from")
            for i, row in enumerate(rows):
                seq = first_seq + i
                if (seq in decoded and decoded[seq] != row) or (seq in log.events and log.events[seq] != row):
                    raise LogError(f"{where}: sample {i} differs from the log's event {seq}: not the records the log "
                                   "learned from")
                decoded[seq] = row
    return decoded
