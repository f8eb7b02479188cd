"""A real Kafka broker for the tests and what they check against it.

``kafka_broker``: tools/kafka_broker.py (Apache Kafka's own jars, KRaft, one node on loopback, stopped by its
PID; a test asks for one started for its module as the ``broker`` fixture of tests/conftest.py). Feedback records
for mlp_classifier.pt; waiting for a service's log to account for them; reading a topic back with Kafka's own
console consumer; the exactly-once check of a log against the topic."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np

from gradbridge import feedback_log

from .data import labelled

REPO = Path(__file__).resolve().parent.parent


def _broker_module():
    spec = importlib.util.spec_from_file_location("kafka_broker", REPO / "tools" / "kafka_broker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kafka_broker = _broker_module()


def feedback_records(n, seed, prefix):
    """n feedback records (one event each) for mlp_classifier.pt: (key, JSON value, x row, y)."""
    x, y = labelled(n, 4, seed=seed)
    return [(f"{prefix}-{i}", json.dumps({"x": [x[i].tolist()], "y": [int(y[i])]}), x[i], int(y[i])) for i in range(n)]


def kafka_options(broker, topic):
    """gradbridge-serve's options to learn from ``topic`` on ``broker`` (the consumer group gb-test)."""
    return ["--kafka-bootstrap", kafka_broker.bootstrap(broker), "--kafka-topic", topic, "--kafka-group", "gb-test"]


def wait_for_records(log_dir, total, timeout=120):
    """Until the log accounts for `total` source records (reading a live log: a torn tail is fine)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            log = feedback_log.read_log(log_dir)
            seen = sum(len(p.items) for p in log.positions)
        except Exception:  # the first write may not be there yet
            seen = -1
        if seen >= total:
            return
        assert time.monotonic() < deadline, f"the service logged {seen} of {total} records"
        time.sleep(0.3)


def check_exactly_once(log_dir, topic, end_offsets, produced, http=()):
    """Every offset of every partition accounted for once, each record's events as produced, each event applied once
    (``http``: the sequence numbers of the events fed over HTTP beside the topic)."""
    log = feedback_log.read_log(log_dir)
    reads = [p for p in log.positions if p.source == topic]
    covered = {}
    items = {}
    for read in reads:
        for partition, start, stop in read.ranges:
            assert covered.get(partition, 0) == start, f"partition {partition}: read {start}..{stop} after {covered.get(partition, 0)}"
            covered[partition] = stop
        for partition, offset, first_seq, count, status in read.items:
            assert (partition, offset) not in items, f"record {partition}/{offset} logged twice"
            items[(partition, offset)] = (first_seq, count, status)
    assert covered == end_offsets, (covered, end_offsets)
    assert len(items) == sum(end_offsets.values())
    # produced: (partition, offset) -> (key, value); the first record of each key owns its events
    first_of_key = {}
    seqs = []
    for (partition, offset), (first_seq, count, status) in sorted(items.items()):
        key, value = produced[(partition, offset)]
        if status == feedback_log.POSITION_LOGGED:
            body = json.loads(value)
            x = np.asarray(body["x"], dtype=np.float32)
            assert count == x.shape[0]
            for i in range(count):
                ex, ey = log.events[first_seq + i]
                assert ex == x[i].tobytes() and ey == np.asarray(body["y"][i], dtype=np.int64).tobytes()
            seqs.extend(range(first_seq, first_seq + count))
            assert key not in first_of_key
            first_of_key[key] = (first_seq, count)
    for (partition, offset), (first_seq, count, status) in sorted(items.items()):
        key, value = produced[(partition, offset)]
        if status == feedback_log.POSITION_DUPLICATE:
            assert first_of_key[key] == (first_seq, count)
    seqs.extend(http)
    assert sorted(seqs) == sorted(log.events) and len(set(seqs)) == len(seqs), "events logged that no record gave, or twice"
    applied = []
    for record in log.order:
        if isinstance(record, feedback_log.Batch):
            applied.extend(range(record.first_seq, record.first_seq + record.count))
    assert sorted(applied) == sorted(seqs), "an event applied twice or never"
    return items


def read_topic(broker, topic, records):
    """(partition, offset) -> (key, value): what the topic holds, read back with Kafka's own console consumer
    (and checked to be ``records``, the (key, value) pairs produced)."""
    out = subprocess.run(
        ["java", *kafka_broker.TOOL_HEAP, "-cp", kafka_broker.classpath(), "org.apache.kafka.tools.consumer.ConsoleConsumer",
         "--bootstrap-server", kafka_broker.bootstrap(broker), "--topic", topic, "--from-beginning", "--timeout-ms", "8000",
         "--property", "print.partition=true", "--property", "print.offset=true", "--property", "print.key=true",
         "--property", "key.separator=\t"], capture_output=True, text=True)
    held = {}
    for line in out.stdout.splitlines():
        m = re.match(r"Partition:(\d+)\tOffset:(\d+)\t([^\t]*)\t(.*)$", line)
        if m:
            held[(int(m.group(1)), int(m.group(2)))] = (None if m.group(3) == "null" else m.group(3), m.group(4))
    assert sorted(held.values()) == sorted(records), "the console consumer did not read back what was produced"
    return held
