"""One History schema: Python writes and reads it strictly, Java writes exactly the same keys."""

from __future__ import annotations

import jpype
import numpy as np
import pytest

from gradbridge import EpochRecord, History
from gradbridge.history import FIELDS


def test_round_trip_keeps_every_float32_bit(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.standard_normal(1000).astype(np.float32)
    history = History([EpochRecord(0, float(np.float32(1 / 3)), {"w": values.astype(np.float64)})])
    loaded = History.load(history.save(tmp_path / "h.jsonl"))
    assert np.array_equal(loaded[0].parameters["w"].astype(np.float32), values)
    assert loaded[0].loss == float(np.float32(1 / 3))


def test_reader_rejects_other_keys(tmp_path):
    with pytest.raises(ValueError, match=r"h\.jsonl:2: expected keys \['epoch', 'loss', 'parameters'\]"):
        bad = tmp_path / "h.jsonl"
        bad.write_text('{"epoch": 0, "loss": 1.0, "parameters": {}}\n{"epoch": 1, "loss": 1.0}\n')
        History.load(bad)


def test_java_writes_the_same_schema(jvm):
    JavaHistory = jpype.JClass("dev.gradbridge.History")
    HashMap = jpype.JClass("java.util.LinkedHashMap")
    params = HashMap()
    params.put("weight", jpype.JArray(jpype.JDouble)([float(np.float32(0.1)), -2.5]))
    history = JavaHistory()
    history.add(JavaHistory.EpochRecord(0, float(np.float32(0.7)), params))
    history.add(JavaHistory.EpochRecord(1, float("nan"), params))
    text = str(history.toJsonLines())
    parsed = History.from_jsonl(text, where="java")
    assert [tuple(r.to_json()) for r in parsed] == [FIELDS, FIELDS]
    assert parsed[0].loss == float(np.float32(0.7))
    assert np.array_equal(parsed[0].parameters["weight"], [float(np.float32(0.1)), -2.5])
    assert np.isnan(parsed[1].loss)
