"""`gradbridge replay`: replay an online learner's log in eager PyTorch and print every version's check."""

from __future__ import annotations

import os
from typing import Optional

from ..errors import InvalidInputError
from ..export.command_line import build_model
from ..replay import KafkaSource, recover, replay


def run(log_dir: str | os.PathLike, model_path: str | os.PathLike, out=print,
        gate_data: str | os.PathLike | None = None, model_factory: Optional[str] = None, from_kafka: bool = False,
        kafka_bootstrap: str | None = None, kafka_topic: str | None = None,
        kafka_properties: str | os.PathLike | None = None) -> int:
    """``gradbridge replay``: print the table and verdict; 0 when every version (and gate decision)
    matches bit for bit. ``model_factory`` (``MODULE:FACTORY``): the user's own nn.Module to replay with
    (a protocol-3 module holds no Python model). ``from_kafka``: the events learned from the topic are
    read from it again."""
    kafka = None
    if from_kafka:
        if not kafka_bootstrap or not kafka_topic:
            raise InvalidInputError("replay --from-kafka needs --kafka-bootstrap and --kafka-topic (as gradbridge serve "
                                    "took them)")
        kafka = KafkaSource(kafka_bootstrap, kafka_topic, kafka_properties)
    elif kafka_bootstrap or kafka_topic or kafka_properties:
        raise InvalidInputError("--kafka-bootstrap, --kafka-topic and --kafka-properties go with replay --from-kafka")
    model = None if model_factory is None else build_model(model_factory)
    report = replay(log_dir, model_path, model, gate_data=gate_data, from_kafka=kafka)
    out(f"{report.log}: {report.batches} micro-batches, {report.events} events applied, "
        f"{report.unapplied_events} logged but not yet applied, {report.quarantined} micro-batches quarantined"
        + (f", torn tail of {report.torn_bytes} bytes ignored" if report.torn_bytes else "")
        + (f"; {report.from_topic} events read again from Kafka topic '{kafka_topic}'" if kafka else ""))
    out(report.table())
    return 0 if report.bitwise else 1


def run_recover(log_dir: str | os.PathLike, into: str | os.PathLike, out=print) -> int:
    """``gradbridge recover-log``: the whole records before a damaged one, into a new log folder."""
    result = recover(log_dir, into)
    if result["bad_offset"] is None:
        out(f"{log_dir}: no damage found; copied {result['kept_records']} records into {into}")
    else:
        out(f"{log_dir}: damaged at offset {result['bad_offset']} ({result['reason']}); copied the "
            f"{result['kept_records']} records before it into {into}, dropped {result['dropped_bytes']} bytes; new "
            f"events start at sequence number {result['seq_floor']}. Start the service on {into}.")
    return 0
