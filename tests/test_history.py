"""One History schema: Python writes and reads it strictly, Java writes exactly the same keys."""

from __future__ import annotations

import hashlib

import jpype
import numpy as np
import pytest

from gradbridge import EpochRecord, History
from gradbridge.history import FIELDS, digest, epoch_loss


def test_round_trip_keeps_every_float32_bit(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.standard_normal(1000).astype(np.float32)
    record = EpochRecord(0, float(np.float32(1 / 3)), {"w": values.astype(np.float64)}, val_loss=0.25,
                         digests={"w": digest(values, "float32")})
    loaded = History.load(History([record]).save(tmp_path / "h.jsonl"))
    assert np.array_equal(loaded[0].parameters["w"].astype(np.float32), values)
    assert loaded[0].loss == float(np.float32(1 / 3)) and loaded[0].val_loss == 0.25
    assert loaded[0].digests["w"] == digest(loaded[0].parameters["w"], "float32")


def test_reader_rejects_other_keys(tmp_path):
    bad = tmp_path / "h.jsonl"
    good = '{"epoch": 0, "loss": 1.0, "val_loss": null, "elapsed_s": 0.1, "parameters": {}, "digests": {}}'
    bad.write_text(good + '\n{"epoch": 1, "loss": 1.0, "parameters": {}}\n')
    with pytest.raises(ValueError, match=r"h\.jsonl:2: expected keys \['epoch', 'loss', 'val_loss', 'elapsed_s'"):
        History.load(bad)


def test_digest_is_sha256_of_little_endian_bytes():
    values = np.array([1.5, -2.0], dtype=np.float32)
    assert digest(values, "float32") == hashlib.sha256(values.astype("<f4").tobytes()).hexdigest()
    assert digest(values.astype(np.float64), "float32") == digest(values, "float32")  # widened values, same digest
    assert digest(values, "float64") != digest(values, "float32")


def test_epoch_loss_sums_in_order():
    assert epoch_loss([1.0, 2.0, 4.0]) == 7.0 / 3
    assert epoch_loss([1e16, 1.0, -1e16]) == 0.0  # sequential float64 sum, not exact summation


def test_java_writes_the_same_schema_and_digests(jvm):
    JavaHistory = jpype.JClass("dev.gradbridge.History")
    LinkedHashMap = jpype.JClass("java.util.LinkedHashMap")
    weight = [float(np.float32(0.1)), -2.5, float(np.float32(1e-30))]
    params = LinkedHashMap()
    params.put("weight", jpype.JArray(jpype.JDouble)(weight))
    digests = LinkedHashMap()
    digests.put("weight", JavaHistory.digest(jpype.JArray(jpype.JDouble)(weight), "float32"))
    history = JavaHistory()
    history.add(JavaHistory.EpochRecord(0, float(np.float32(0.7)), None, 0.5, params, digests))
    history.add(JavaHistory.EpochRecord(1, float("nan"), 0.125, 1.0, LinkedHashMap(), digests))
    parsed = History.from_jsonl(str(history.toJsonLines()), where="java")
    assert [tuple(r.to_json()) for r in parsed] == [FIELDS, FIELDS]
    assert parsed[0].loss == float(np.float32(0.7)) and parsed[0].val_loss is None
    assert np.array_equal(parsed[0].parameters["weight"], weight)
    assert parsed[0].digests["weight"] == digest(np.array(weight, dtype=np.float32), "float32")
    assert np.isnan(parsed[1].loss) and parsed[1].val_loss == 0.125 and parsed[1].parameters == {}
    run_start = jpype.JClass("dev.gradbridge.internal.RunStart")  # the epoch loss of every Java trainer
    assert float(run_start.epochLoss(jpype.JArray(jpype.JDouble)([1e16, 1.0, -1e16]))) == epoch_loss([1e16, 1.0, -1e16])
    # in this process the records cross as binary arrays (java.train): the same records as the text
    binary = History.from_java(history)
    assert [r.to_json() for r in binary][0] == parsed[0].to_json()
    assert np.isnan(binary[1].loss) and binary[1].val_loss == 0.125 and binary[1].parameters == {}
    assert binary[0].parameters["weight"].dtype == np.float64
