"""History: what a training run did, epoch by epoch, and its JSON Lines form.

One line per epoch::

    {"epoch": 0, "loss": 12.61, "parameters": {"weight": [1.94], "bias": [0.06]}}

``epoch`` counts from 0; ``loss`` is the loss computed during that epoch (before its step);
``parameters`` are the values after the epoch's step, flattened row-major, by parameter name
in the module's ``parameter_names()`` order. Values are float32 widened to float64, so the
text round-trips every bit. The Java writer (``dev.gradbridge.History``) emits exactly these
keys; ``tests/test_history.py`` reads a Java-written file with this strict reader.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import numpy as np

#: The keys of one history line, in order.
FIELDS = ("epoch", "loss", "parameters")


@dataclass
class EpochRecord:
    epoch: int
    loss: float
    parameters: Dict[str, np.ndarray] = field(default_factory=dict)

    def to_json(self) -> Dict:
        return {
            "epoch": int(self.epoch),
            "loss": float(self.loss),
            "parameters": {name: [float(v) for v in np.asarray(values).ravel()] for name, values in self.parameters.items()},
        }

    @classmethod
    def from_json(cls, document: Dict, *, where: str = "history") -> "EpochRecord":
        if not isinstance(document, dict) or tuple(document) != FIELDS:
            keys = list(document) if isinstance(document, dict) else type(document).__name__
            raise ValueError(f"{where}: expected keys {list(FIELDS)}, got {keys}")
        return cls(
            epoch=int(document["epoch"]),
            loss=float(document["loss"]),
            parameters={name: np.asarray(values, dtype=np.float64) for name, values in document["parameters"].items()},
        )


@dataclass
class History:
    records: List[EpochRecord] = field(default_factory=list)

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

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically: a temporary file in the same folder, then a rename."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(self.to_jsonl())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "History":
        path = Path(path)
        return cls.from_jsonl(path.read_text(encoding="utf-8"), where=str(path))

