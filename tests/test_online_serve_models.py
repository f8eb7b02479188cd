"""Real models served by gradbridge-serve (a JVM of its own) while they learn from feedback: an HF BERT
with its attention mask and dropout, a ResNet-18 (BatchNorm), a PEFT LoRA BERT over HTTP, and a
Llama-style decoder (its rotary frequencies a constant buffer) and a bfloat16 BERT from a Kafka topic; each killed -9
mid-stream, restarted, and `gradbridge replay` bit for bit against the user's own eager model, dropout
and BatchNorm statistics included (tests/models/zoo.py builds them from tiny random configs). The
service runs on the checkout's libtorch (the jar's, the oldest of the range), so these run on the
oldest torch; the newest runs the same learner in process (tests/test_online_real_models.py)."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import torch

from gradbridge import export_training_module, protocol
from gradbridge import replay as replay_mod

from .models import zoo
from .kafka_support import kafka_broker, kafka_options, wait_for_records
from .serving import Service

OPTIONS = ("--max-batch", 4, "--max-wait-ms", 2, "--publish-every", 2, "--checkpoint-every", 3, "--fsync", "always",
           "--predictors", 1, "--seed", 17)


def _export(tmp_path, build, data, fmt="auto"):
    torch.manual_seed(0)
    model = build()
    x, y = data(4, 0)
    path = tmp_path / "model.pt"
    trainable = [p for p in model.parameters() if p.requires_grad]
    export_training_module(model, "cross_entropy", torch.optim.AdamW(trainable, lr=1e-3), path,
                           example_inputs=(x, y), format=fmt)
    return path


def _body(x, y, rows):
    """A /feedback body (or a Kafka record's value) for rows of x (a tensor, or tensors by name) and y."""
    if isinstance(x, dict):
        inputs = {name: t[rows].tolist() for name, t in x.items()}
    else:
        inputs = x[rows].tolist()
    return {"x": inputs, "y": y[rows].tolist()}


def _post(service, x, y, starts):
    for start in starts:
        status, text = service.post("/feedback", _body(x, y, slice(start, start + 2)), timeout=30)
        assert status == 200, text
        status, text = service.post("/predict", {"x": _body(x, y, slice(start, start + 1))["x"]}, timeout=30)
        assert status == 200, text


def _replays_bitwise(log_dir, path, build, events):
    report = replay_mod.replay(log_dir, path, model=build())
    print(report.table())
    assert report.bitwise, report.table()
    assert report.events == events and report.unapplied_events == 0
    return report


def _http_kill_9_restart(serve_script, tmp_path, build, data, n=24, fmt="auto"):
    path = _export(tmp_path, build, data, fmt)
    x, y = data(n, 1)
    log_dir = tmp_path / "log"
    starts = list(range(0, n, 2))
    with Service(serve_script, path, log_dir, *OPTIONS) as service:
        _post(service, x, y, starts[:len(starts) // 2])
        service.process.send_signal(signal.SIGKILL)  # acknowledged, maybe not applied: the log holds them
        service.process.wait(timeout=30)
    with Service(serve_script, path, log_dir, *OPTIONS) as service:
        _post(service, x, y, starts[len(starts) // 2:])
        code, _, err = service.terminate()
        assert code == 0, err
    return path, _replays_bitwise(log_dir, path, build, n)


def test_bert_with_mask_and_dropout_over_http_kill_9_restart_replays_bitwise(serve_script, tmp_path):
    path, report = _http_kill_9_restart(serve_script, tmp_path, zoo.bert, zoo._tokens, fmt="torchscript")
    metadata = protocol.read_metadata(path)
    assert metadata[protocol.CAPTURE_KEY][protocol.DRAWS_RANDOM_KEY] is True
    assert not [b for b in metadata["buffers"] if b["trained"]]  # position_ids, token_type_ids: constants
    assert len(report.rows) >= 4


@pytest.mark.slow  # ~75 s (its export ~30 s): --full; BatchNorm online in every run: test_online_real_models.py
def test_resnet_batchnorm_over_http_kill_9_restart_replays_bitwise(serve_script, tmp_path):
    path, _ = _http_kill_9_restart(serve_script, tmp_path, zoo.resnet18, zoo._images, n=12, fmt="torchscript")
    assert any(b["trained"] for b in protocol.read_metadata(path)["buffers"])  # BatchNorm's statistics ride along


def test_peft_lora_bert_over_http_kill_9_restart_replays_bitwise(serve_script, tmp_path):
    path, _ = _http_kill_9_restart(serve_script, tmp_path, zoo.lora_bert, zoo._tokens)
    parameters = protocol.read_metadata(path)["parameters"]
    trainable = [p["name"] for p in parameters if p["trainable"]]
    assert len(trainable) < len(parameters) / 2, "PEFT froze the base"
    # a version publishes what training changes (the adapters and the head), never the frozen base
    assert all(sorted(v.digests) == sorted(trainable) for v in replay_mod.read_log(tmp_path / "log").versions)


def _kafka_kill_9_restart(serve_script, broker, tmp_path, build, topic, n=32):
    """n records on a topic of two partitions, the service killed -9 after 8 and restarted; replayed bitwise."""
    path = _export(tmp_path, build, zoo._tokens)
    kafka_broker.create_topic(broker, topic, partitions=2)
    x, y = zoo._tokens(n, 1)
    records = [(f"k-{i}", json.dumps(_body(x, y, slice(i, i + 1)))) for i in range(n)]
    kafka_broker.produce(broker, topic, records[:20])
    log_dir = tmp_path / "log"
    options = (*OPTIONS, *kafka_options(broker, topic))
    with Service(serve_script, path, log_dir, *options) as service:
        wait_for_records(log_dir, 8)
        service.process.send_signal(signal.SIGKILL)
        service.process.wait(timeout=30)
    kafka_broker.produce(broker, topic, records[20:])
    with Service(serve_script, path, log_dir, *options) as service:
        wait_for_records(log_dir, n)
        code, _, err = service.terminate()
        assert code == 0, err
    _replays_bitwise(log_dir, path, build, n)
    return path, log_dir


@pytest.mark.slow  # CI's time: --full (one fast case of its kind stays in the default run)
def test_llama_decoder_from_kafka_kill_9_restart_replays_bitwise(serve_script, broker, tmp_path):
    path, log_dir = _kafka_kill_9_restart(serve_script, broker, tmp_path, zoo.llama, "feedback-llama")
    assert [b["name"] for b in protocol.read_metadata(path)["buffers"] if not b["trained"]] == [
        "model.model.rotary_emb.inv_freq"]
    source = replay_mod.KafkaSource(kafka_broker.bootstrap(broker), "feedback-llama")
    assert replay_mod.replay(log_dir, path, model=zoo.llama(), from_kafka=source).bitwise


def _bfloat16_bert():
    return zoo.bert().to(torch.bfloat16)


def test_a_bfloat16_bert_from_kafka_kill_9_restart_replays_bitwise(serve_script, broker, tmp_path):
    """bfloat16 weights and AdamW state, as LLMs are fine-tuned (issue 48): learned online from a topic, the
    versions and the replay in bfloat16, bit for bit."""
    path, _ = _kafka_kill_9_restart(serve_script, broker, tmp_path, _bfloat16_bert, "feedback-bf16")
    assert {p["dtype"] for p in protocol.read_metadata(path)["parameters"]} == {"bfloat16"}
