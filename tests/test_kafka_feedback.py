"""gradbridge-serve learning from a real Kafka broker (Apache Kafka's own jars, KRaft, loopback), exactly once.

The broker comes from tools/kafka_broker.py (Gradle fetches the jars; storage formatted in a temporary
folder; a free port on 127.0.0.1; stopped by its PID). No mocks. The checks, after kill -9 of the service
mid-stream and restarts: the log's source offsets cover every partition of the topic from its first offset
to its end without gap or overlap, each record's events are logged once (a duplicate key is answered from
the first record, a poison record is logged as refused), every logged event is applied exactly once, and
`gradbridge replay` of the log equals the service bit for bit.

The default run has one case of each scenario (kill -9 mid-stream; a read's write torn inside its events);
the slower ones are marked `slow` and run with `pytest --full` (tests/conftest.py).
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from gradbridge import feedback_log
from gradbridge import replay as replay_mod

from .data import labelled
from .faults import gradbridge_cli
from .kafka_support import (check_exactly_once, feedback_records, kafka_broker, kafka_options, read_topic,
                            wait_for_records)
from .serving import Service

REPO = Path(__file__).resolve().parent.parent


def test_kill_9_mid_stream_then_restart_applies_every_record_once(serve_script, broker, models, tmp_path):
    model = models["mlp_classifier.pt"]
    topic = "feedback-fast"
    kafka_broker.create_topic(broker, topic, partitions=3)
    first = [(k, v) for k, v, _, _ in feedback_records(150, 0, "a")]
    # a duplicate (same key, same value), a poison record, a key used with other feedback, a NaN
    first += [first[5], ("poison-1", "{not json"), (first[7][0], first[8][1]), ("nan-1", '{"x": [[NaN, 0, 0, 0]], "y": [0]}')]
    kafka_broker.produce(broker, topic, first)
    log_dir = tmp_path / "log"
    options = ["--max-batch", 8, "--max-wait-ms", 2, "--publish-every", 2, "--checkpoint-every", 5,
               "--fsync", "always", *kafka_options(broker, topic)]
    with Service(serve_script, model, log_dir, *options) as service:
        wait_for_records(log_dir, 40)
        service.process.send_signal(signal.SIGKILL)  # mid-stream: records read, some not logged, some not applied
        service.process.wait(timeout=30)
    second = [(k, v) for k, v, _, _ in feedback_records(100, 1, "b")] + [first[20]]  # a duplicate across the restart
    kafka_broker.produce(broker, topic, second)
    records = first + second
    with Service(serve_script, model, log_dir, *options) as service:
        wait_for_records(log_dir, len(records))
        status, metrics = service.get("/metrics")
        assert status == 200 and "gradbridge_kafka_lag{" in metrics and "gradbridge_kafka_records_refused_total" in metrics
        code, out, err = service.terminate()
        assert code == 0, err
    end_offsets = kafka_broker.end_offsets(broker, topic)
    assert sum(end_offsets.values()) == len(records)
    produced = read_topic(broker, topic, records)
    items = check_exactly_once(log_dir, topic, end_offsets, produced)
    statuses = [status for _, _, status in items.values()]
    assert statuses.count(feedback_log.POSITION_REFUSED) == 3  # poison, key conflict, NaN
    assert statuses.count(feedback_log.POSITION_DUPLICATE) == 2
    report = replay_mod.replay(log_dir, model)
    assert report.bitwise, report.table()
    # the topic itself, read again: the same events, the same versions bit for bit
    source = replay_mod.KafkaSource(kafka_broker.bootstrap(broker), topic)
    from_topic = replay_mod.replay(log_dir, model, from_kafka=source)
    assert from_topic.bitwise and from_topic.from_topic == len(feedback_log.read_log(log_dir).events), from_topic.table()
    assert [(r.version, r.digest_python) for r in from_topic.rows] == [(r.version, r.digest_python) for r in report.rows]
    result = gradbridge_cli("replay", "--log", log_dir, "--model", model, "--from-kafka", "--kafka-bootstrap",
                            source.bootstrap, "--kafka-topic", topic)
    assert result.returncode == 0 and f"events read again from Kafka topic '{topic}'" in result.stdout, result.stderr


def test_two_instances_in_one_group_each_learn_the_whole_topic_once(serve_script, broker, models, tmp_path):
    """Two services (each its own log folder) in one consumer group: no rebalance moves a partition (each is assigned
    every partition; one model learns from the whole topic), kill -9 of one mid-stream does not disturb the other,
    and the killed one, restarted after the other has committed the group's offsets to the end, reads on from its own
    log, not from the group's offsets: each log covers every partition exactly once and replays bitwise."""
    model = models["mlp_classifier.pt"]
    topic = "feedback-group"
    kafka_broker.create_topic(broker, topic, partitions=4)
    records = [(k, v) for k, v, _, _ in feedback_records(200, 11, "g")]
    kafka_broker.produce(broker, topic, records)
    options = ["--max-batch", 8, "--max-wait-ms", 2, "--publish-every", 2, "--checkpoint-every", 3,
               "--fsync", "always", *kafka_options(broker, topic)]
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    with Service(serve_script, model, first_dir, *options) as first, \
            Service(serve_script, model, second_dir, *options) as second:
        wait_for_records(first_dir, 30)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=30)
        more = [(k, v) for k, v, _, _ in feedback_records(100, 12, "h")]
        kafka_broker.produce(broker, topic, more)
        records += more
        wait_for_records(second_dir, len(records))
        end_offsets = kafka_broker.end_offsets(broker, topic)
        deadline = time.monotonic() + 30
        while kafka_broker.committed_offsets(broker, "gb-test", topic) != end_offsets:  # committed after each read
            assert time.monotonic() < deadline, kafka_broker.committed_offsets(broker, "gb-test", topic)
            time.sleep(0.5)
        behind = sum(len(p.items) for p in feedback_log.read_log(first_dir).positions)
        assert behind < len(records), "the first service had read everything before it was killed"
        with Service(serve_script, model, first_dir, *options) as first:  # its log is behind the group's offsets
            wait_for_records(first_dir, len(records))
            for service in (first, second):
                code, _, err = service.terminate()
                assert code == 0, err
    produced = read_topic(broker, topic, records)
    for log_dir in (first_dir, second_dir):
        check_exactly_once(log_dir, topic, end_offsets, produced)
        report = replay_mod.replay(log_dir, model)
        assert report.bitwise, report.table()


def test_http_and_kafka_feedback_together_through_a_kill_9_each_apply_once(serve_script, broker, models, tmp_path):
    """HTTP requests (with idempotency keys) posted while the topic is read, the service killed mid-way, the
    requests without an answer retried after the restart: every record and every request is logged once, both
    sources in one order of sequence numbers, every event applied once, replay bitwise from the log and from the topic
    (which reads the topic's events again and the HTTP events from the log)."""
    import threading
    import urllib.error

    model = models["mlp_classifier.pt"]
    topic = "feedback-mixed"
    kafka_broker.create_topic(broker, topic, partitions=2)
    records = [(k, v) for k, v, _, _ in feedback_records(300, 21, "m")]
    kafka_broker.produce(broker, topic, records)
    x, y = labelled(240, 4, seed=22)
    requests = [(f"h-{i // 2}", {"x": x[i:i + 2].tolist(), "y": y[i:i + 2].tolist()}) for i in range(0, 240, 2)]
    answered = {}
    log_dir = tmp_path / "log"
    options = ["--max-batch", 8, "--max-wait-ms", 2, "--publish-every", 2, "--checkpoint-every", 4, "--fsync", "always",
               *kafka_options(broker, topic)]

    def post_all(service, stop):
        for key, body in requests:
            if key in answered or stop.is_set():
                continue
            try:
                status, text = service.post("/feedback", body, headers={"Idempotency-Key": key})
            except (OSError, urllib.error.URLError):
                return  # the service is gone: this request has no answer
            assert status == 200, text
            answered[key] = json.loads(text)

    with Service(serve_script, model, log_dir, *options) as service:
        stop = threading.Event()
        poster = threading.Thread(target=post_all, args=(service, stop))
        try:
            poster.start()
            wait_for_records(log_dir, 100)
            deadline = time.monotonic() + 60
            while len(answered) < 30 and poster.is_alive():
                assert time.monotonic() < deadline, f"{len(answered)} requests answered"
                time.sleep(0.05)
            service.process.send_signal(signal.SIGKILL)
            service.process.wait(timeout=30)
            stop.set()
            poster.join(timeout=30)
        finally:
            stop.set()
    assert 0 < len(answered) < len(requests), len(answered)
    first_answers = dict(answered)
    more = [(k, v) for k, v, _, _ in feedback_records(100, 23, "n")]
    kafka_broker.produce(broker, topic, more)
    records += more
    with Service(serve_script, model, log_dir, *options) as service:
        post_all(service, threading.Event())  # the rest, and retries of those never answered
        for key, body in requests[:3]:  # answered before the kill: the same events again, nothing logged twice
            again = json.loads(service.post("/feedback", body, headers={"Idempotency-Key": key})[1])
            assert again["duplicate"] and again["first_seq"] == first_answers[key]["first_seq"], again
        wait_for_records(log_dir, len(records))
        code, _, err = service.terminate()
        assert code == 0, err
    log = feedback_log.read_log(log_dir)
    http = []
    for key, body in requests:
        first, count = log.keys[key]
        assert (first, count) == (answered[key]["first_seq"], 2), key
        assert [log.events[first + i][0] for i in range(count)] == [np.asarray(r, np.float32).tobytes() for r in body["x"]]
        http.extend(range(first, first + count))
    end_offsets = kafka_broker.end_offsets(broker, topic)
    check_exactly_once(log_dir, topic, end_offsets, read_topic(broker, topic, records), http=http)
    report = replay_mod.replay(log_dir, model)
    assert report.bitwise, report.table()
    from_topic = replay_mod.replay(log_dir, model, from_kafka=replay_mod.KafkaSource(kafka_broker.bootstrap(broker), topic))
    assert from_topic.bitwise and from_topic.from_topic == len(log.events) - len(http), from_topic.table()


def _torn_read_cuts(log_dir):
    """The log's bytes and the last read's write: (data, its S record's offset, the S frame's end, the write's end)."""
    log = feedback_log.read_log(log_dir)
    data = (Path(log_dir) / feedback_log.FILE_NAME).read_bytes()
    last = log.positions[-1]
    assert last.following > 0, "the last read logged no event"
    (length,) = struct.unpack_from("<I", data, last.offset)
    s_end = last.offset + feedback_log.FRAME_HEADER + length
    return data, last.offset, s_end, s_end + last.following


def _frame_ends(data, start, stop):
    """Offsets of the frame boundaries in data[start:stop]."""
    ends = []
    while start < stop:
        (length,) = struct.unpack_from("<I", data, start)
        start += feedback_log.FRAME_HEADER + length
        ends.append(start)
    return ends


@pytest.mark.parametrize("every_cut", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_read_torn_anywhere_in_its_write_is_read_again_once(serve_script, broker, models, tmp_path, every_cut):
    """A crash that tears the write of one read (its S record, events and keys) leaves no event without its offsets:
    the whole write is a torn tail, cut on start, and its records are read again from the topic, exactly once."""
    model = models["mlp_classifier.pt"]
    topic = f"feedback-torn-{int(every_cut)}"
    kafka_broker.create_topic(broker, topic, partitions=3)
    records = [(k, v) for k, v, _, _ in feedback_records(90, 3, "t")]
    records.append(records[4])  # a duplicate: its key is logged again after the cut
    kafka_broker.produce(broker, topic, records)
    options = ["--max-batch", 8, "--max-wait-ms", 2, "--publish-every", 2, *kafka_options(broker, topic)]
    whole_dir = tmp_path / "whole"
    with Service(serve_script, model, whole_dir, *options) as service:
        wait_for_records(whole_dir, len(records))
        code, _, err = service.terminate()
        assert code == 0, err
    data, start, s_end, write_end = _torn_read_cuts(whole_dir)
    ends = _frame_ends(data, s_end, write_end)
    assert ends[-1] == write_end
    whole = feedback_log.read_log(whole_dir)
    last_read = {first + i for _, _, first, count, status in whole.positions[-1].items
                 if status == feedback_log.POSITION_LOGGED for i in range(count)}
    # the reader (Python here, Java on start) cuts the whole write wherever it is torn
    for cut in sorted({*range(start + 1, min(s_end + 20, write_end)), *(e + d for e in ends for d in (-1, 0, 1))}):
        if start < cut < write_end:
            torn_dir = tmp_path / "reader"
            torn_dir.mkdir(exist_ok=True)
            (torn_dir / feedback_log.FILE_NAME).write_bytes(data[:cut])
            torn = feedback_log.read_log(torn_dir)
            assert (torn.end, torn.torn_bytes) == (start, cut - start), cut
            assert len(torn.positions) == len(whole.positions) - 1 and not last_read & set(torn.events), cut
    # restarted on the torn log, the service reads those records again from the topic: exactly once, bitwise
    cuts = [s_end + 5] if not every_cut else sorted({start + 1, start + 12, s_end - 1, s_end, *ends[:3], ends[0] + 7,
                                                     write_end - 1})
    end_offsets = kafka_broker.end_offsets(broker, topic)
    produced = read_topic(broker, topic, records)
    for cut in cuts:
        log_dir = tmp_path / f"cut-{cut}"
        log_dir.mkdir()
        (log_dir / feedback_log.FILE_NAME).write_bytes(data[:cut])
        with Service(serve_script, model, log_dir, *options) as service:
            wait_for_records(log_dir, len(records))
            code, _, err = service.terminate()
            assert code == 0, err
        assert f"cut a torn tail of {cut - start} bytes at offset {start}" in err
        check_exactly_once(log_dir, topic, end_offsets, produced)
        report = replay_mod.replay(log_dir, model)
        assert report.bitwise, report.table()


def _refused_start(script, model, log_dir, *options):
    result = subprocess.run([str(script), "--model", str(model), "--log", str(log_dir), "--port", "0", "--no-auth",
                             *map(str, options)], capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return result.returncode, lines


def test_bad_kafka_options_are_one_line_and_leave_no_log_folder(serve_script, models, tmp_path):
    model = models["mlp_classifier.pt"]
    log_dir = tmp_path / "log"
    code, lines = _refused_start(serve_script, model, log_dir, "--kafka-topic", "t")
    assert code == 1 and lines == ["error: Kafka feedback needs both --kafka-bootstrap and --kafka-topic"], lines
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=PLAINTEXT\nenable.auto.commit=true\n")
    code, lines = _refused_start(serve_script, model, log_dir, "--kafka-bootstrap", "127.0.0.1:9", "--kafka-topic", "t",
                                 "--kafka-properties", props)
    assert code == 1 and len(lines) == 1 and "enable.auto.commit is set by gradbridge-serve" in lines[0], lines
    code, lines = _refused_start(serve_script, model, log_dir, "--kafka-bootstrap", "127.0.0.1:9", "--kafka-topic", "t",
                                 "--kafka-properties", tmp_path / "missing.properties")
    assert code == 1 and len(lines) == 1 and "missing.properties: no such file" in lines[0], lines
    assert not log_dir.exists()


def test_a_topic_that_does_not_exist_is_one_line_and_leaves_no_log_folder(serve_script, broker, models, tmp_path):
    log_dir = tmp_path / "log"
    code, lines = _refused_start(serve_script, models["mlp_classifier.pt"], log_dir,
                                 *kafka_options(broker, "no-such-topic"))
    assert code == 1 and len(lines) == 1 and "Kafka topic 'no-such-topic' does not exist" in lines[0], lines
    assert not log_dir.exists()


def _killed_mid_stream(serve_script, broker, model, log_dir, topic, options, rounds, next_batch, while_up, timeout):
    """The service through ``rounds`` rounds on a topic of 4 partitions: each produces ``next_batch(round_, records)``
    (the records produced so far), starts the service on the log and runs ``while_up(round_, applied_before)``
    (``applied_before``: the records of the earlier rounds); then kill -9, but the last round waits for every
    record and stops cleanly. Returns the records, the topic's end offsets and ``check_exactly_once``'s items."""
    kafka_broker.create_topic(broker, topic, partitions=4)
    records = []
    for round_ in range(rounds):
        batch = next_batch(round_, records)
        kafka_broker.produce(broker, topic, batch)
        records += batch
        with Service(serve_script, model, log_dir, *options) as service:
            while_up(round_, len(records) - len(batch))
            if round_ < rounds - 1:
                service.process.send_signal(signal.SIGKILL)
                service.process.wait(timeout=30)
            else:
                wait_for_records(log_dir, len(records), timeout=timeout)
                code, _, err = service.terminate()
                assert code == 0, err
    end_offsets = kafka_broker.end_offsets(broker, topic)
    return records, end_offsets, check_exactly_once(log_dir, topic, end_offsets, read_topic(broker, topic, records))


@pytest.mark.slow
def test_repeated_kill_9_and_a_broker_restart_apply_every_record_once(serve_script, broker, models, tmp_path):
    """Four kill -9 at random points while records arrive, a broker restart in the middle; then exactly once and bitwise."""
    model = models["mlp_classifier.pt"]
    topic = "feedback-slow"
    log_dir = tmp_path / "log"
    options = ["--max-batch", 16, "--max-wait-ms", 1, "--publish-every", 3, "--checkpoint-every", 4,
               "--fsync", "always", *kafka_options(broker, topic)]
    rng = np.random.default_rng(7)

    def next_batch(round_, records):
        batch = [(k, v) for k, v, _, _ in feedback_records(300, 10 + round_, f"r{round_}")]
        if records:
            batch.append(records[int(rng.integers(len(records)))])  # a duplicate of an earlier record
        return batch

    def while_up(round_, _):
        if round_ == 2:
            kafka_broker.stop(broker)  # the service waits for it
            time.sleep(2)
            kafka_broker.start(broker)
        time.sleep(float(rng.uniform(1.0, 4.0)))

    _killed_mid_stream(serve_script, broker, model, log_dir, topic, options, 5, next_batch, while_up, timeout=300)
    report = replay_mod.replay(log_dir, model)
    assert report.bitwise, report.table()


@pytest.mark.slow
def test_a_gated_learner_killed_repeatedly_mid_stream_applies_every_record_once(serve_script, broker, models, tmp_path):
    """The streaming scenario whole: a topic of 4 partitions, 2,400 records with duplicates, a poison record and
    poisoned but finite feedback, a publish gate, the service killed three times mid-stream. Every offset accounted for
    once, every event applied once, replay from the log and from the topic bitwise with every gate loss recomputed,
    and no published version worse than the gate allows."""
    from gradbridge.feedback_log import GATE_PUBLISHED

    model = models["mlp_classifier.pt"]
    topic = "feedback-gated"
    gx, gy = labelled(64, 4, seed=7)
    gate = tmp_path / "gate.npz"
    np.savez(gate, x=gx, y=gy)
    regression = 0.05
    log_dir = tmp_path / "log"
    options = ["--max-batch", 8, "--max-wait-ms", 2, "--publish-every", 5, "--checkpoint-every", 4, "--fsync", "always",
               "--gate-data", gate, "--gate-max-regression", regression, *kafka_options(broker, topic)]
    rng = np.random.default_rng(17)

    def next_batch(round_, records):
        batch = [(k, v) for k, v, _, _ in feedback_records(560, 30 + round_, f"s{round_}")]
        bad_x, bad_y = labelled(40, 4, seed=40 + round_)  # finite but harmful: forty times the scale, every label wrong
        batch += [(f"p{round_}-{i}", json.dumps({"x": [(40 * bad_x[i]).tolist()], "y": [int(2 - bad_y[i])]}))
                  for i in range(40)]
        earlier = [r for r in records if r[0].startswith("s")]
        batch += [earlier[int(rng.integers(len(earlier)))] for _ in range(3 if earlier else 0)]  # duplicates
        if round_ == 1:
            batch.append(("poison-1", "{not json"))
        return batch

    def while_up(round_, applied_before):
        if round_ < 3:  # killed once a random part of this round is logged
            wait_for_records(log_dir, applied_before + int(rng.integers(50, 500)), timeout=300)

    records, end_offsets, items = _killed_mid_stream(serve_script, broker, model, log_dir, topic, options, 4,
                                                     next_batch, while_up, timeout=600)
    assert sum(end_offsets.values()) == len(records) > 2400
    assert [status for _, _, status in items.values()].count(feedback_log.POSITION_REFUSED) == 1  # the poison record
    report = replay_mod.replay(log_dir, model)
    source = replay_mod.KafkaSource(kafka_broker.bootstrap(broker), topic)
    from_topic = replay_mod.replay(log_dir, model, from_kafka=source)
    for replayed in (report, from_topic):
        assert replayed.bitwise and replayed.gate_losses_checked and replayed.unapplied_events == 0, replayed.table()
    assert from_topic.from_topic == len(feedback_log.read_log(log_dir).events)
    assert [(g.version, g.loss_python, g.decision_python) for g in from_topic.gates] == \
        [(g.version, g.loss_python, g.decision_python) for g in report.gates]
    assert any(g.decision_java != GATE_PUBLISHED for g in report.gates), "the poisoned feedback held nothing back"
    for row in report.gates:  # no published version is worse than the gate allows
        assert (row.loss_java <= row.serving_loss_java + regression) == (row.decision_java == GATE_PUBLISHED), row


@pytest.mark.slow
def test_the_kafka_fed_benchmark_runs_and_reports_both_variants(tmp_path):
    """benchmarks/kafka_online_bench.py end to end on a small size (its own broker): both rates and latencies."""
    import sys

    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "kafka_online_bench.py"), "--events", "1024",
                             "--rounds", "1", "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads((tmp_path / "kafka-bench.json").read_text())
    assert figures["events"] == 1024
    for key in ("http_json_events_per_s", "kafka_events_per_s", "kafka_steady_events_per_s", "kafka_p99_us"):
        assert len(figures["by_round"][key]) == 1 and figures["by_round"][key][0] > 0, key
    assert "kafka / JSON-fed throughput" in result.stdout
