"""gradbridge-serve's Kafka source under faults (a real KRaft broker, tools/kafka_broker.py): a bad client
property is one line naming it; partitions added while serving are read without a restart, each record
once; a topic deleted while serving is one line when it goes (no flood of the client's retries), counted
in /metrics, and training and predictions go on."""

from __future__ import annotations

import json
import time

from gradbridge import feedback_log
from gradbridge import replay as replay_mod

from .faults import one_error_line
from .kafka_support import (check_exactly_once, feedback_records, kafka_broker, kafka_options, read_topic,
                            wait_for_records)
from .serving import Service

OPTIONS = ("--max-batch", 8, "--max-wait-ms", 2, "--publish-every", 2, "--checkpoint-every", 5, "--fsync", "always")


def test_a_bad_client_property_is_one_line_naming_it(serve_script, broker, models, tmp_path):
    import subprocess

    kafka_broker.create_topic(broker, "bad-props")
    properties = tmp_path / "client.properties"
    properties.write_text("default.api.timeout.ms=abc\n")
    result = subprocess.run([str(serve_script), "--model", str(models["mlp_classifier.pt"]), "--log", str(tmp_path / "log"),
                             "--port", "0", *kafka_options(broker, "bad-props"), "--kafka-properties", str(properties)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "default.api.timeout.ms" in one_error_line(result) and "abc" in one_error_line(result), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # no client log line before it
    assert not (tmp_path / "log").exists()


def test_partitions_added_while_serving_are_read_each_record_once(serve_script, broker, models, tmp_path):
    model = models["mlp_classifier.pt"]
    topic = "feedback-grows"
    kafka_broker.create_topic(broker, topic, partitions=1)
    records = [(k, v) for k, v, _, _ in feedback_records(40, 31, "p")]
    kafka_broker.produce(broker, topic, records)
    log_dir = tmp_path / "log"
    with Service(serve_script, model, log_dir, *OPTIONS, *kafka_options(broker, topic)) as service:
        wait_for_records(log_dir, 40)
        kafka_broker.tool(broker, "org.apache.kafka.tools.TopicCommand", "--alter", "--topic", topic, "--partitions", "3")
        more = [(k, v) for k, v, _, _ in feedback_records(60, 32, "q")]
        kafka_broker.produce(broker, topic, more)  # keyed: spread over the three partitions
        records += more
        end_offsets = kafka_broker.end_offsets(broker, topic)
        assert len(end_offsets) == 3 and all(end_offsets.values())
        started = time.monotonic()
        wait_for_records(log_dir, len(records), timeout=60)  # the bound: metadata.max.age.ms (10 s) + 2 s, plus reading
        assert time.monotonic() - started < 30
        code, _, err = service.terminate()
        assert code == 0, err
    check_exactly_once(log_dir, topic, end_offsets, read_topic(broker, topic, records))
    assert replay_mod.replay(log_dir, model).bitwise


def test_a_topic_deleted_while_serving_is_one_line_and_counted_no_flood(serve_script, broker, models, tmp_path):
    model = models["mlp_classifier.pt"]
    topic = "feedback-deleted"
    kafka_broker.create_topic(broker, topic, partitions=2)
    kafka_broker.produce(broker, topic, [(k, v) for k, v, _, _ in feedback_records(30, 41, "d")])
    log_dir = tmp_path / "log"
    with Service(serve_script, model, log_dir, *OPTIONS, *kafka_options(broker, topic)) as service:
        wait_for_records(log_dir, 30)
        kafka_broker.tool(broker, "org.apache.kafka.tools.TopicCommand", "--delete", "--topic", topic)
        time.sleep(12)
        status, metrics = service.get("/metrics")
        assert status == 200 and "gradbridge_kafka_waiting 1.0" in metrics, metrics[-2000:]
        outages = [line for line in metrics.splitlines() if line.startswith("gradbridge_kafka_outages_total")]
        assert outages and float(outages[0].split()[-1]) >= 1, outages
        # the service still answers and learns from HTTP meanwhile
        status, body = service.post("/feedback", {"x": [[0.1, 0.2, 0.3, 0.4]], "y": [1]})
        assert status == 200, body
        assert service.post("/predict", {"x": [[0.1, 0.2, 0.3, 0.4]]})[0] == 200
        code, _, err = service.terminate()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) <= 5, "\n".join(lines[:20])  # the condition once, not a line per retry
    assert any("is gone from" in line and topic in line for line in lines), err
    log = feedback_log.read_log(log_dir)
    assert len(log.events) == 31
    assert replay_mod.replay(log_dir, model).bitwise
