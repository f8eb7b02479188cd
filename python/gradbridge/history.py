"""History: what a training run did, epoch by epoch, and its JSON Lines form.

One line per epoch, keys in this order (``FIELDS``)::

    {"epoch": 0, "loss": 12.61, "val_loss": null, "elapsed_s": 0.01,
     "parameters": {"weight": [1.94], "bias": [0.06]},
     "digests": {"weight": "5b0c...", "bias": "a3f1..."}}

- ``epoch`` counts from 0 over the whole run (a resumed run continues the count);
- ``loss`` is the epoch's training loss: the mean of its batch losses, summed in batch order in
  float64 (one batch in full-batch mode);
- ``val_loss`` is the validation loss after the epoch (eval mode, no gradients), or null;
- ``elapsed_s`` is wall time since the run started (not compared by parity);
- ``parameters`` are the values after the epoch, flattened row-major, by name in
  ``parameter_names()`` order; float32 values widened to float64, so the text round-trips every
  bit; empty when the run recorded digests only;
- ``digests`` are SHA-256 hex digests of each parameter's little-endian bytes in its own dtype
  (``digest``): equal digests mean bitwise equal parameters;
- ``lrs`` (optional; absent in histories written before it existed) is each parameter
  group's learning rate after the epoch, after the epoch-end schedule step if there is one;
- ``threads`` (optional; gradbridge-spark runs) is libtorch's intra-op thread count each
  task trained the epoch on: ``reference.train_sharded`` replays the run on it.
- ``sharded`` (optional; gradbridge-spark runs, the same in every line of a run) is what the replay of the
  run takes besides ``threads``: ``{"partitions": 2, "batch_size": 32, "seed": 0, "shuffle": true,
  "rule": "partition-order", "shards_sha256": "..."}`` (``ShardedRun``; ``rule`` is
  ``protocol.SHARDED_RULE``, ``shards_sha256`` the data's digest in its partitions, as the run's checkpoint
  names it). ``reference.train_sharded(..., run=)`` and ``gradbridge parity --spark-history`` read both keys.
- ``device`` and ``deterministic`` (optional, together; runs on a device other than the CPU) are the
  device the epoch trained on (``"cuda:0"``) and whether torch's deterministic algorithms were on.
- ``values`` (optional, last) says where the values are when a record has more than
  ``INLINE_VALUES_LIMIT`` of them (``parameters`` is then ``{}``): ``{"file": "h.jsonl.values",
  "offset": 0, "counts": {"weight": 4096, ...}, "sha256": "..."}``; the side file (its name relative
  to the history's folder) holds them from ``offset`` as float64 little-endian, parameter after
  parameter in ``counts`` order; ``sha256`` is of those bytes, checked when the history is read.

A run writes its first epoch as a new file and appends each later epoch's line (the side file's
block first), so a line is never rewritten; a run killed mid-write leaves a last line without its
newline that is not JSON, which ``History.load`` drops with a warning.

The Java writer (``dev.gradbridge.History``) emits exactly these keys; ``tests/test_history.py``
reads a Java-written file with this strict reader and recomputes the digests.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ._runtime.files import atomic_path

#: The keys of one history line, in order.
FIELDS = ("epoch", "loss", "val_loss", "elapsed_s", "parameters", "digests")

#: Optional keys that may follow FIELDS, each at most once, in this order.
OPTIONAL_FIELDS = ("lrs", "threads", "sharded", "device", "deterministic", "values")

#: Above this many parameter values in one record, a history file keeps them in its side file
#: (Java: ``Messages.HISTORY_INLINE_VALUES``): a million values are ~20 MB of JSON text per epoch.
INLINE_VALUES_LIMIT = 1_000_000
#: The side file's name: the history's with this suffix.
VALUES_SUFFIX = ".values"

_LITTLE_ENDIAN = {"float32": "<f4", "float64": "<f8", "int64": "<i8", "float16": "<f2"}


def digest(values, dtype: str) -> str:
    """SHA-256 hex of ``values`` as little-endian ``dtype`` bytes, flattened row-major. ``values``: a numpy
    array (or a torch tensor) holding them exactly, e.g. widened to float64. bfloat16, which numpy lacks,
    hashes each value's 16-bit word: the upper half of its float32 bits (exact for a bfloat16 value)."""
    if hasattr(values, "detach"):  # a torch tensor, of a dtype numpy may lack
        values = values.detach().cpu()
        values = values.double().numpy() if values.is_floating_point() else values.numpy()  # widened exactly
    flat = np.asarray(values).ravel()
    if dtype == "bfloat16":
        words = (np.ascontiguousarray(flat, dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
        return hashlib.sha256(words.tobytes()).hexdigest()
    return hashlib.sha256(np.ascontiguousarray(flat, dtype=_LITTLE_ENDIAN[dtype]).tobytes()).hexdigest()


def epoch_loss(batch_losses: Sequence[float]) -> float:
    """The epoch's loss: batch losses summed in order in float64, divided by their count."""
    total = 0.0
    for value in batch_losses:
        total += float(value)
    return total / len(batch_losses)


@dataclass(frozen=True)
class ShardedRun:
    """A gradbridge-spark run's settings, as each line of its history records them (the ``sharded`` key)."""
    partitions: int
    batch_size: int
    seed: int
    shuffle: bool
    rule: str
    shards_sha256: str

    #: the key's fields, in order, each with the JSON type it holds
    KEYS = (("partitions", int), ("batch_size", int), ("seed", int), ("shuffle", bool), ("rule", str),
            ("shards_sha256", str))

    def to_json(self) -> Dict:
        return {name: getattr(self, name) for name, _ in self.KEYS}

    @classmethod
    def from_json(cls, value: Any, where: str) -> Optional["ShardedRun"]:
        """The ``sharded`` key of a line, checked (None: the line has none)."""
        if value is None:
            return None
        if (not isinstance(value, dict) or list(value) != [name for name, _ in cls.KEYS]
                or not all(isinstance(value[name], kind) and (kind is bool or not isinstance(value[name], bool))
                           for name, kind in cls.KEYS)
                or value["partitions"] < 1 or value["batch_size"] < 1):
            raise ValueError(f'{where}: "sharded" must be {{"partitions": K >= 1, "batch_size": B >= 1, "seed": S, '
                             f'"shuffle": true|false, "rule": name, "shards_sha256": hex}}, got {value!r}')
        return cls(**value)


@dataclass
class EpochRecord:
    epoch: int
    loss: float
    parameters: Dict[str, np.ndarray] = field(default_factory=dict)
    val_loss: Optional[float] = None
    elapsed_s: float = 0.0
    digests: Dict[str, str] = field(default_factory=dict)
    lrs: Optional[List[float]] = None
    threads: Optional[int] = None
    #: a gradbridge-spark run's partitions, batch size, seed, shuffling, rule and data digest
    sharded: Optional[ShardedRun] = None
    #: the device of a run not on the CPU (``"cuda:0"``), and whether torch's deterministic algorithms were on
    device: Optional[str] = None
    deterministic: Optional[bool] = None
    #: where a history file keeps this record's values (its ``values`` key), until ``History.load`` reads them
    values_at: Optional[Dict] = None

    def value_count(self) -> int:
        return sum(int(np.asarray(values).size) for values in self.parameters.values())

    def to_json(self, values_at: Optional[Dict] = None) -> Dict:
        """The record's line; ``values_at``: its values are in a side file there, not inline."""
        document = {
            "epoch": int(self.epoch),
            "loss": float(self.loss),
            "val_loss": None if self.val_loss is None else float(self.val_loss),
            "elapsed_s": float(self.elapsed_s),
            "parameters": {} if values_at is not None else
            {name: [float(v) for v in np.asarray(values).ravel()] for name, values in self.parameters.items()},
            "digests": dict(self.digests),
        }
        if self.lrs is not None:
            document["lrs"] = [float(lr) for lr in self.lrs]
        if self.threads is not None:
            document["threads"] = int(self.threads)
        if self.sharded is not None:
            document["sharded"] = self.sharded.to_json()
        if self.device is not None:
            document["device"] = str(self.device)
            document["deterministic"] = bool(self.deterministic)
        if values_at is not None:
            document["values"] = values_at
        return document

    @classmethod
    def from_json(cls, document: Dict, *, where: str = "history") -> "EpochRecord":
        keys = tuple(document) if isinstance(document, dict) else ()
        extra = keys[len(FIELDS):]
        if not isinstance(document, dict) or keys[:len(FIELDS)] != FIELDS or extra != tuple(
                k for k in OPTIONAL_FIELDS if k in extra):
            keys = list(document) if isinstance(document, dict) else type(document).__name__
            raise ValueError(f"{where}: expected keys {list(FIELDS)}, got {keys}")
        return cls(
            epoch=int(document["epoch"]),
            loss=float(document["loss"]),
            parameters={name: np.asarray(values, dtype=np.float64) for name, values in document["parameters"].items()},
            val_loss=None if document["val_loss"] is None else float(document["val_loss"]),
            elapsed_s=float(document["elapsed_s"]),
            digests=dict(document["digests"]),
            lrs=None if document.get("lrs") is None else [float(v) for v in document["lrs"]],
            threads=None if document.get("threads") is None else int(document["threads"]),
            sharded=ShardedRun.from_json(document.get("sharded"), where),
            device=None if document.get("device") is None else str(document["device"]),
            deterministic=None if document.get("deterministic") is None else bool(document["deterministic"]),
            values_at=_values_key(document.get("values"), where),
        )


@dataclass
class History:
    records: List[EpochRecord] = field(default_factory=list)
    #: A replay's buffers after its last epoch, by name (``reference.train_sharded``: BatchNorm's statistics,
    #: which a run's checkpoint holds); not part of the JSON Lines.
    buffers: Dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def __getitem__(self, index: int) -> EpochRecord:
        return self.records[index]

    @property
    def losses(self) -> np.ndarray:
        return np.array([r.loss for r in self.records], dtype=np.float64)

    def append(self, record: EpochRecord) -> None:
        self.records.append(record)

    def to_jsonl(self) -> str:
        # allow_nan: a diverged epoch's NaN loss is still written (as NaN, which both readers accept)
        return "".join(json.dumps(r.to_json()) + "\n" for r in self.records)

    @classmethod
    def from_jsonl(cls, text: str, *, where: str = "history", folder: Optional[Path] = None) -> "History":
        """The records of a history's text. ``folder``: where its side file is (a record whose values
        are there needs it). A last line without its newline that is not JSON was cut off by a run
        that stopped while writing it: dropped, with a warning; any other line that is not JSON is refused."""
        records = []
        lines = text.split("\n")
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    document = json.loads(line)
                except json.JSONDecodeError as ex:
                    if number == len(lines):  # no newline after it: the run stopped mid-line
                        warnings.warn(f"{where}:{number}: the last line is cut off (the run stopped while writing it); "
                                      f"read without it", stacklevel=2)
                        break
                    raise ValueError(f"{where}:{number}: not JSON: {ex}") from ex
                record = EpochRecord.from_json(document, where=f"{where}:{number}")
                if record.values_at is not None:
                    if folder is None:
                        raise ValueError(f"{where}:{number}: its values are in {record.values_at['file']}; "
                                         "read the history with History.load(path)")
                    record.parameters = _read_values(folder, record.values_at, f"{where}:{number}")
                records.append(record)
        return cls(records)

    @classmethod
    def from_java(cls, history) -> "History":
        """A Java ``dev.gradbridge.History`` of this process's JVM (JPype), read as binary arrays:
        each parameter's values copied as one block from the record's direct buffer (an
        11-million-parameter record as JSON text took seconds every epoch; as Java double[] arrays,
        ~0.5 s), or from its double[] for a record made from arrays."""
        records = []
        for record in history.getRecords():
            val_loss, lrs, threads, sharded = record.getValLoss(), record.getLrs(), record.getThreads(), record.getSharded()
            device, deterministic = record.getDevice(), record.getDeterministic()
            buffers = record.getParameterBuffers()
            if buffers.isEmpty():
                parameters = {str(name): np.array(values, dtype=np.float64)
                              for name, values in record.getParameters().items()}
            else:  # float64 in native order (Java's ByteOrder.nativeOrder())
                parameters = {str(name): np.frombuffer(memoryview(values), dtype=np.float64).copy()
                              for name, values in buffers.items()}
            records.append(EpochRecord(
                epoch=int(record.getEpoch()),
                loss=float(record.getLoss()),
                parameters=parameters,
                val_loss=None if val_loss is None else float(val_loss.doubleValue()),
                elapsed_s=float(record.getElapsedSeconds()),
                digests={str(name): str(value) for name, value in record.getDigests().items()},
                lrs=None if lrs is None else [float(v) for v in lrs],
                threads=None if threads is None else int(threads.intValue()),
                sharded=None if sharded is None else ShardedRun(
                    int(sharded.getPartitions()), int(sharded.getBatchSize()), int(sharded.getSeed()),
                    bool(sharded.isShuffle()), str(sharded.getRule()), str(sharded.getShardsSha256())),
                device=None if device is None else str(device),
                deterministic=None if deterministic is None else bool(deterministic.booleanValue())))
        return cls(records)

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically: a temporary file in the same folder, then a rename; the values of a record of
        more than ``INLINE_VALUES_LIMIT`` go to the side file ``path + VALUES_SUFFIX`` (written first)."""
        path = Path(path)
        side = path.with_name(path.name + VALUES_SUFFIX)
        places: List[Optional[Dict]] = [None] * len(self.records)
        if any(r.value_count() > INLINE_VALUES_LIMIT for r in self.records):
            with atomic_path(side) as tmp, open(tmp, "wb") as out:
                for index, record in enumerate(self.records):
                    if record.value_count() > INLINE_VALUES_LIMIT:
                        places[index] = _write_values(out, record, side.name)
        with atomic_path(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as out:
                for record, place in zip(self.records, places):
                    out.write(json.dumps(record.to_json(place)) + "\n")
        if all(place is None for place in places):
            side.unlink(missing_ok=True)  # an earlier history's, which no line names now
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "History":
        path = Path(path)
        return cls.from_jsonl(path.read_text(encoding="utf-8"), where=str(path), folder=path.parent)


def _values_key(values: Any, where: str) -> Optional[Dict]:
    """A line's ``values`` key, checked: file, offset, counts and sha256."""
    if values is None:
        return None
    if (not isinstance(values, dict) or list(values) != ["file", "offset", "counts", "sha256"]
            or not isinstance(values["file"], str) or "/" in values["file"] or not isinstance(values["offset"], int)
            or values["offset"] < 0 or not isinstance(values["counts"], dict)
            or not all(isinstance(n, int) and n >= 0 for n in values["counts"].values())):
        raise ValueError(f"{where}: \"values\" must be {{\"file\": name, \"offset\": bytes, \"counts\": "
                         f"{{parameter: values}}, \"sha256\": hex}}, got {values!r}")
    return values


def _read_values(folder: Path, values: Dict, where: str) -> Dict[str, np.ndarray]:
    """The record's values from the side file, mapped (not read into memory), their bytes checked."""
    side = folder / values["file"]
    total = sum(values["counts"].values())
    size = side.stat().st_size if side.is_file() else -1
    if size < values["offset"] + 8 * total:
        raise ValueError(f"{where}: its values are {8 * total} bytes at offset {values['offset']} of {side}, "
                         f"which has {max(size, 0)} bytes" + ("" if size >= 0 else " (no such file)"))
    array = (np.memmap(side, dtype="<f8", mode="r", offset=values["offset"], shape=(total,)) if total
             else np.zeros(0, dtype="<f8"))
    sha = hashlib.sha256()
    for start in range(0, total, 1 << 22):
        sha.update(memoryview(np.ascontiguousarray(array[start:start + (1 << 22)])).cast("B"))
    if sha.hexdigest() != values["sha256"]:
        raise ValueError(f"{where}: its values at offset {values['offset']} of {side} do not match their sha256 "
                         "(the file was changed or cut)")
    parameters, start = {}, 0
    for name, count in values["counts"].items():
        parameters[name] = array[start:start + count]
        start += count
    return parameters


def _write_values(out: Any, record: EpochRecord, file: str) -> Dict:
    """Append the record's values (float64 little-endian) to ``out``; returns its ``values`` key."""
    offset = out.tell()
    sha = hashlib.sha256()
    counts = {}
    for name, values in record.parameters.items():
        data = np.ascontiguousarray(np.asarray(values).ravel(), dtype="<f8")
        sha.update(data.data)
        out.write(data.data)
        counts[name] = int(data.size)
    return {"file": file, "offset": offset, "counts": counts, "sha256": sha.hexdigest()}

