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
- ``threads`` (optional, last; gradbridge-spark runs) is libtorch's intra-op thread count each
  task trained the epoch on: ``reference.train_sharded`` replays the run on it.

The Java writer (``dev.gradbridge.History``) emits exactly these keys; ``tests/test_history.py``
reads a Java-written file with this strict reader and recomputes the digests.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from ._runtime.files import atomic_path

#: The keys of one history line, in order.
FIELDS = ("epoch", "loss", "val_loss", "elapsed_s", "parameters", "digests")

#: Optional keys that may follow FIELDS, in this order.
OPTIONAL_FIELDS = ("lrs", "threads")

_LITTLE_ENDIAN = {"float32": "<f4", "float64": "<f8", "int64": "<i8"}


def digest(values, dtype: str) -> str:
    """SHA-256 hex of ``values`` as little-endian ``dtype`` bytes, flattened row-major."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(values).ravel(), dtype=_LITTLE_ENDIAN[dtype]).tobytes()).hexdigest()


def epoch_loss(batch_losses: Sequence[float]) -> float:
    """The epoch's loss: batch losses summed in order in float64, divided by their count."""
    total = 0.0
    for value in batch_losses:
        total += float(value)
    return total / len(batch_losses)


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

    def to_json(self) -> Dict:
        document = {
            "epoch": int(self.epoch),
            "loss": float(self.loss),
            "val_loss": None if self.val_loss is None else float(self.val_loss),
            "elapsed_s": float(self.elapsed_s),
            "parameters": {name: [float(v) for v in np.asarray(values).ravel()] for name, values in self.parameters.items()},
            "digests": dict(self.digests),
        }
        if self.lrs is not None:
            document["lrs"] = [float(lr) for lr in self.lrs]
        if self.threads is not None:
            document["threads"] = int(self.threads)
        return document

    @classmethod
    def from_json(cls, document: Dict, *, where: str = "history") -> "EpochRecord":
        keys = tuple(document) if isinstance(document, dict) else ()
        extra = keys[len(FIELDS):]
        if not isinstance(document, dict) or keys[:len(FIELDS)] != FIELDS or extra != tuple(
                name for name in OPTIONAL_FIELDS if name in extra):
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
    def from_jsonl(cls, text: str, *, where: str = "history") -> "History":
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    document = json.loads(line)
                except json.JSONDecodeError as ex:
                    raise ValueError(f"{where}:{number}: not JSON: {ex}") from ex
                records.append(EpochRecord.from_json(document, where=f"{where}:{number}"))
        return cls(records)

    @classmethod
    def from_java(cls, history) -> "History":
        """A Java ``dev.gradbridge.History`` of this process's JVM (JPype), read as binary arrays:
        each parameter's values copied as one block from the record's direct buffer (an
        11-million-parameter record as JSON text took seconds every epoch; as Java double[] arrays,
        ~0.5 s), or from its double[] for a record made from arrays."""
        records = []
        for record in history.getRecords():
            val_loss, lrs, threads = record.getValLoss(), record.getLrs(), record.getThreads()
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
                threads=None if threads is None else int(threads.intValue())))
        return cls(records)

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically: a temporary file in the same folder, then a rename."""
        path = Path(path)
        with atomic_path(path) as tmp:
            tmp.write_text(self.to_jsonl(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "History":
        path = Path(path)
        return cls.from_jsonl(path.read_text(encoding="utf-8"), where=str(path))

