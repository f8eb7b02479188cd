"""The Java OnlineLearner driven through JPype from several Java threads, checked against the eager
replay (gradbridge.replay): every published version bit for bit, every prediction equal to what its
reported version computes, and a restart (halt mid-stream, torn tail, resume) equal to a run that
never stopped."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from gradbridge import replay as replay_mod
from gradbridge.commands.main import main as cli_main
from gradbridge.reference import Reference

from .data import labelled
from .online_support import host_tensor, open_learner


def _final_digests(learner):
    version = learner.currentVersion()
    return int(version.getId()), {str(k): str(v) for k, v in version.getDigests().items()}


def test_concurrent_feedback_and_predictions_replay_bitwise(jvm, models, tmp_path):
    import jpype

    model = models["mlp_classifier.pt"]
    x, y = labelled(600, 4, labels="mixed")
    learner = open_learner(model, tmp_path / "log", fsync="always")
    try:
        OnlineLoad = jpype.JClass("dev.gradbridge.bench.OnlineLoad")
        result = OnlineLoad.run(learner, host_tensor(x), host_tensor(y), 4, 3, 2, 150)
        assert learner.awaitIdle(30, jpype.JClass("java.util.concurrent.TimeUnit").SECONDS)
        assert learner.stats().getAcceptedEvents() == 600
    finally:
        learner.close()

    report = replay_mod.replay(tmp_path / "log", model, keep_parameters=True)
    print(report.table())
    assert report.bitwise, report.verdict()
    assert report.events == 600 and report.unapplied_events == 0
    assert len(report.rows) >= 2 and report.rows[-1].updates == report.batches

    # Every prediction equals what its reported version computes (eager forward on the replayed parameters).
    versions = np.array(result.getVersions(), dtype=np.int64)
    rows = np.array(result.getPredictedRows(), dtype=np.int64)
    assert len(versions) == 300
    per_thread = versions.reshape(2, 150)
    assert (np.diff(per_thread, axis=1) >= 0).all(), "a client saw an older version after a newer one"
    reference = Reference(model)
    checked = 0
    for version_id in np.unique(versions):
        params = report.parameters[int(version_id)]
        with torch.no_grad():
            for name, p in reference.model.named_parameters():
                p.copy_(params[name])
            for slot in np.flatnonzero(versions == version_id):
                expected = reference.model(torch.from_numpy(x[rows[slot]:rows[slot] + 1])).numpy()
                got = np.frombuffer(bytes(result.getOutputs()[int(slot)]), dtype="<f4").reshape(expected.shape)
                assert got.tobytes() == expected.astype("<f4").tobytes(), f"prediction {slot} (version {version_id})"
                checked += 1
    assert checked == 300


def _tear(log_file, junk: bytes):
    with open(log_file, "ab") as f:
        f.write(junk)


def test_restart_from_checkpoint_and_log_tail_equals_a_run_that_never_stopped(jvm, models, tmp_path):
    import jpype

    TimeUnit = jpype.JClass("java.util.concurrent.TimeUnit")
    model = models["linear_regression.pt"]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((60, 1)).astype(np.float32)
    y = (3 * x + 0.5).astype(np.float32)
    log_dir = tmp_path / "log"

    # Phase 1: 40 events in calls of 4, each applied as its own micro-batch; checkpoints at versions 0, 5, ...
    learner = open_learner(model, log_dir, batch=4, wait_ms=0, publish=2, checkpoint=5)
    for i in range(0, 40, 4):
        learner.learn(host_tensor(x[i:i + 4]), host_tensor(y[i:i + 4]))
        assert learner.awaitIdle(10, TimeUnit.SECONDS)
    learner.halt()  # a crash: no final version, no final checkpoint
    checkpoint = json.loads((log_dir / "checkpoint.json").read_text())
    assert checkpoint["version"] == 5 and checkpoint["scan_offset"] > 0

    # Phase 2: 20 more events are acknowledged but wait in the queue (B=1000, T=60 s) when it halts; then a torn write.
    learner = open_learner(model, log_dir, batch=1000, wait_ms=60_000, publish=2, checkpoint=5)
    for i in range(40, 60, 4):
        learner.learn(host_tensor(x[i:i + 4]), host_tensor(y[i:i + 4]))
    assert learner.stats().getQueueDepth() == 20
    learner.halt()
    _tear(log_dir / "feedback.log", replay_mod.frame(b"E" * 500)[:60])  # a frame cut short by a crash
    assert replay_mod.read_log(log_dir).torn_bytes == 60

    # Phase 3: resume: checkpoint 5 + the logged tail, then the 20 acknowledged events are applied.
    learner = open_learner(model, log_dir, batch=4, wait_ms=0, publish=2, checkpoint=5)
    try:
        assert learner.awaitIdle(10, TimeUnit.SECONDS)
    finally:
        learner.close()
    restarted = replay_mod.read_log(log_dir)
    assert restarted.torn_bytes == 0, "the torn tail was not cut on start"
    assert sum(b.count for b in restarted.batches) == 60
    report = replay_mod.replay(log_dir, model)
    assert report.bitwise, report.table()

    # A run that never stopped, given the same micro-batches.
    control_dir = tmp_path / "control"
    control = open_learner(model, control_dir, batch=1000, wait_ms=0, publish=2, checkpoint=5)
    try:
        for batch in restarted.batches:
            s = batch.first_seq
            control.learn(host_tensor(x[s:s + batch.count]), host_tensor(y[s:s + batch.count]))
            assert control.awaitIdle(10, TimeUnit.SECONDS)
    finally:
        control.close()
    assert [(b.first_seq, b.count) for b in replay_mod.read_log(control_dir).batches] == \
        [(b.first_seq, b.count) for b in restarted.batches]
    final_restarted = restarted.versions[-1]
    final_control = replay_mod.read_log(control_dir).versions[-1]
    assert final_restarted.updates == final_control.updates == len(restarted.batches)
    assert final_restarted.digests == final_control.digests


def test_back_pressure_and_bad_feedback_are_refused_with_nothing_logged(jvm, models, tmp_path):
    import jpype

    model = models["mlp_classifier.pt"]
    learner = open_learner(model, tmp_path / "log", batch=1000, wait_ms=60_000, capacity=8)
    x, y = labelled(12, 4, labels="mixed")
    try:
        learner.learn(host_tensor(x[:8]), host_tensor(y[:8]))
        with pytest.raises(jpype.JClass("dev.gradbridge.online.QueueFullException")) as full:
            learner.learn(host_tensor(x[8:9]), host_tensor(y[8:9]))
        assert "queue is full (8 of 8" in str(full.value.getMessage())
        assert learner.stats().getRefusedEvents() == 1
        InvalidInput = jpype.JClass("dev.gradbridge.InvalidInputException")
        with pytest.raises(InvalidInput, match="input x must be float32 of shape"):
            learner.learn(host_tensor(x[:2, :3].copy()), host_tensor(y[:2]))
        with pytest.raises(InvalidInput, match="x has 2 rows but y has 1"):
            learner.learn(host_tensor(x[:2]), host_tensor(y[:1]))
        bad = x[:1].copy()
        bad[0, 0] = np.nan
        with pytest.raises(InvalidInput, match="NaN or infinite"):
            learner.learn(host_tensor(bad), host_tensor(y[:1]))
        with pytest.raises(InvalidInput, match="rejected by the model's loss"):
            learner.learn(host_tensor(x[:1]), host_tensor(np.array([7], dtype=np.int64)))  # 3 classes
    finally:
        learner.close()  # drains the 8 queued events
    log = replay_mod.read_log(tmp_path / "log")
    assert sorted(log.events) == list(range(8))
    assert [(b.first_seq, b.count) for b in log.batches] == [(0, 8)]
    assert replay_mod.replay(tmp_path / "log", model).bitwise


def _rewrite_version_digest(log_file):
    """Change version 1's first digest and re-frame it with valid checksums (not the last version:
    checkpoint.json holds that one, and a log that contradicts the checkpoint is refused outright)."""
    data = bytearray(log_file.read_bytes())
    last = None
    for off, payload in replay_mod.frames(log_file, bytes(data)):
        if payload[:1] == b"V" and struct.unpack_from("<q", payload, 1)[0] == 1:
            last = (off, payload)
    off, payload = last
    digests = json.loads(payload[25:].decode())
    name = next(iter(digests))
    digests[name] = "0" * len(digests[name])
    new_payload = payload[:25] + json.dumps(digests, separators=(",", ":")).encode()
    assert len(new_payload) == len(payload)
    data[off:off + replay_mod.FRAME_HEADER + len(payload)] = replay_mod.frame(new_payload)
    log_file.write_bytes(bytes(data))


def test_replay_cli_table_exit_codes_and_bad_logs(jvm, models, tmp_path, capsys):
    import jpype

    model = models["linear_regression.pt"]
    learner = open_learner(model, tmp_path / "log", batch=4, wait_ms=1, publish=1)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(16, 1)
    try:
        learner.learn(host_tensor(x), host_tensor(2 * x))
        assert learner.awaitIdle(10, jpype.JClass("java.util.concurrent.TimeUnit").SECONDS)
    finally:
        learner.close()

    assert cli_main(["replay", "--log", str(tmp_path / "log"), "--model", str(model)]) == 0
    out = capsys.readouterr().out
    assert "python replay: bitwise identical:" in out and " NO" not in out

    _rewrite_version_digest(tmp_path / "log" / "feedback.log")
    assert cli_main(["replay", "--log", str(tmp_path / "log"), "--model", str(model)]) == 1
    out = capsys.readouterr().out
    assert "python replay: differs at version" in out and " NO" in out

    assert cli_main(["replay", "--log", str(tmp_path / "missing"), "--model", str(model)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gradbridge: error: no feedback log at")

    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "feedback.log").write_bytes(b"not a log at all")
    assert cli_main(["replay", "--log", str(tmp_path / "junk"), "--model", str(model)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gradbridge: error: {tmp_path / 'junk' / 'feedback.log'} is not a gradbridge feedback log (no header record)"]

    assert cli_main(["replay", "--log", str(tmp_path / "log"), "--model", str(models["mlp_classifier.pt"])]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "offset 0: it was written for the module with SHA-256" in err[0]


def test_a_log_replayed_onto_another_initial_model_is_refused(jvm, models, tmp_path):
    import jpype

    from gradbridge import export_builtin

    model = models["linear_regression.pt"]
    learner = open_learner(model, tmp_path / "log", batch=4, wait_ms=0, publish=1, checkpoint=1000)
    try:
        learner.learn(host_tensor(np.ones((4, 1), np.float32)), host_tensor(np.full((4, 1), 2, np.float32)))
        assert learner.awaitIdle(10, jpype.JClass("java.util.concurrent.TimeUnit").SECONDS)
    finally:
        learner.halt()  # no final checkpoint: a resume replays the log from the module
    other = export_builtin("linear-regression", tmp_path / "other.pt", seed=1)  # same shapes, other initial values
    with pytest.raises(jpype.JClass("dev.gradbridge.online.LogCorruptException"),
                       match="offset 0: it was written for the module with SHA-256 .* start another log folder"):
        open_learner(other, tmp_path / "log", publish=1)
    with pytest.raises(replay_mod.LogError, match="offset 0: it was written for the module with SHA-256"):
        replay_mod.replay(tmp_path / "log", other)
    assert replay_mod.replay(tmp_path / "log", model).bitwise


def test_a_module_with_gradient_accumulation_is_refused_in_one_line(jvm, tmp_path):
    """Online learning applies one step per micro-batch; the factor is said as the integer it is (issue 46)."""
    import jpype

    from gradbridge import export_training_module

    x, y = labelled(8, 4, tensors=True)
    path = export_training_module(torch.nn.Linear(4, 3), "cross_entropy", "sgd", tmp_path / "m.pt",
                                  example_inputs=(x, y), accumulate=2, format="torchscript")
    with pytest.raises(jpype.JClass("dev.gradbridge.InvalidInputException"),
                       match=r"m\.pt accumulates gradients over 2 micro-batches; online learning applies one step "
                             r"per micro-batch \(export without accumulate\)$"):
        open_learner(path, tmp_path / "log")
