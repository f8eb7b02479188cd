"""One History schema: Python writes and reads it strictly, Java writes exactly the same keys."""

from __future__ import annotations

import hashlib
import json

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


def test_java_writes_a_spark_runs_threads_and_settings(jvm):
    """A gradbridge-spark record's optional "threads" and "sharded" keys, in the schema's order, as text and as
    binary records; Python writes the same line back."""
    JavaHistory = jpype.JClass("dev.gradbridge.History")
    ShardedRun = jpype.JClass("dev.gradbridge.ShardedRun")
    LinkedHashMap = jpype.JClass("java.util.LinkedHashMap")
    digests = LinkedHashMap()
    digests.put("w", "00" * 32)
    history = JavaHistory()
    history.add(JavaHistory.EpochRecord(3, 0.5, None, 1.0, LinkedHashMap(), digests, jpype.JArray(jpype.JDouble)([0.1]))
                .withThreads(2).withSharded(ShardedRun(4, 64, -7, False, "partition-order", "ab" * 32)))
    text = str(history.toJsonLines())
    record = History.from_jsonl(text, where="java")[0]
    assert list(json.loads(text)) == [*FIELDS, "lrs", "threads", "sharded"]
    assert record.threads == 2 and record.sharded.to_json() == {
        "partitions": 4, "batch_size": 64, "seed": -7, "shuffle": False, "rule": "partition-order",
        "shards_sha256": "ab" * 32}
    assert History.from_java(history)[0].to_json() == record.to_json()
    assert json.dumps(record.to_json(), separators=(",", ":")) + "\n" == text
    with pytest.raises(ValueError, match='java:1: "sharded" must be'):
        History.from_jsonl(text.replace('"batch_size":64', '"batch_size":true'), where="java")


# ---- streamed histories: a line per epoch appended, large values in the side file ----

def _big_record(epoch, values):
    return EpochRecord(epoch, 0.5 + epoch, {"w": values[:-3], "b": values[-3:]},
                       digests={"w": digest(values[:-3], "float32"), "b": digest(values[-3:], "float32")})


def test_values_above_the_limit_go_to_the_side_file_and_read_back(tmp_path):
    from gradbridge.history import INLINE_VALUES_LIMIT, VALUES_SUFFIX

    values = np.random.default_rng(1).standard_normal(INLINE_VALUES_LIMIT + 1).astype(np.float32).astype(np.float64)
    path = History([_big_record(0, values), _big_record(1, -values)]).save(tmp_path / "h.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    side = tmp_path / ("h.jsonl" + VALUES_SUFFIX)
    assert [line["parameters"] for line in lines] == [{}, {}]
    assert [line["values"]["offset"] for line in lines] == [0, 8 * values.size]
    assert lines[0]["values"]["counts"] == {"w": values.size - 3, "b": 3} and side.stat().st_size == 16 * values.size
    loaded = History.load(path)
    assert np.array_equal(loaded[1].parameters["w"], -values[:-3]) and np.array_equal(loaded[0].parameters["b"], values[-3:])
    # a changed byte in the side file is found, and named
    with open(side, "r+b") as out:
        out.seek(8 * values.size + 5)
        out.write(b"\x7f")
    with pytest.raises(ValueError, match=r"h\.jsonl:2: its values at offset 8000008 of .*h\.jsonl\.values do not match"):
        History.load(path)
    # a small history written there again leaves no side file behind
    History([EpochRecord(0, 1.0, {"w": np.zeros(2)})]).save(path)
    assert not side.exists() and History.load(path)[0].parameters["w"].tolist() == [0.0, 0.0]


def test_a_torn_last_line_is_dropped_and_an_earlier_one_refused(tmp_path):
    path = History([EpochRecord(e, 1.0, {"w": np.full(3, float(e))}) for e in range(2)]).save(tmp_path / "h.jsonl")
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[0][:25])  # a run killed in the middle of epoch 2's line
    with pytest.warns(UserWarning, match=r"h\.jsonl:3: the last line is cut off"):
        assert [r.epoch for r in History.load(path)] == [0, 1]
    path.write_text(whole.splitlines()[0][:25] + "\n" + whole)
    with pytest.raises(ValueError, match=r"h\.jsonl:1: not JSON"):
        History.load(path)


def test_java_appends_each_epoch_and_keeps_large_values_aside(jvm, tmp_path):
    """A model of over a million values, trained by the Java Trainer in this process with a history: two
    lines, their values in the side file, bitwise the eager run's; the in-memory records read the same."""
    import torch

    from gradbridge import compare_histories, export_training_module, java, reference

    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((16, 1000)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 1000, 16).astype(np.int64)
    model = torch.nn.Linear(1000, 1000)
    path = export_training_module(model, "cross_entropy", {"name": "adam", "lr": 0.01}, tmp_path / "big.pt",
                                  example_inputs=(torch.from_numpy(x[:8]), torch.from_numpy(y[:8])),
                                  format="torchscript")
    history_file = tmp_path / "h.jsonl"
    in_java = java.train(path, x, y, epochs=2, batch_size=8, history=history_file)
    lines = [json.loads(line) for line in history_file.read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [0, 1] and all(line["parameters"] == {} for line in lines)
    assert lines[1]["values"]["offset"] == 8 * 1_001_000
    written = History.load(history_file)
    eager = reference.train(path, x, y, epochs=2, batch_size=8, model=model)
    assert compare_histories(eager, written).bitwise
    assert compare_histories(eager, in_java).bitwise
