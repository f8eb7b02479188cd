"""Publish gates and rollbacks in gradbridge-serve, with real HTTP clients and real restarts.

A gate publishes a version only when its loss on the gate data is within --gate-max-regression of the
serving version's. Poisoned but finite feedback (large features, wrong labels) raises that loss: the
versions it makes are held back while predictions stay on the version before, and the replay takes
every decision again from the gate data, bit for bit (both losses and the decision)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from gradbridge import replay as replay_mod
from gradbridge.feedback_log import GATE_PUBLISHED, GATE_ROLLED_BACK, Gate
from gradbridge.reference import Reference

from .data import labelled
from .faults import gradbridge_cli
from .serving import Service

MAX_REGRESSION = 0.05
PUBLISH_EVERY = 5


@pytest.fixture
def gate_data(tmp_path):
    x, y = labelled(64, 4, seed=7)
    path = tmp_path / "gate.npz"
    np.savez(path, x=x, y=y)
    return path


def _options(gate_data, *extra, regression=MAX_REGRESSION):
    return ("--fsync", "never", "--max-batch", 1, "--max-wait-ms", 0, "--publish-every", PUBLISH_EVERY,
            "--checkpoint-every", 3, "--gate-data", gate_data, "--gate-max-regression", regression, *extra)


def _feed(service, x, y, rows=4):
    for start in range(0, len(x), rows):
        status, body = service.post("/feedback", {"x": x[start:start + rows].tolist(), "y": y[start:start + rows].tolist()})
        assert status == 200, body


def _settle(service, events):
    """Waits until every event is applied and every version it made is decided (max batch 1: one update each)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        health = json.loads(service.get("/healthz")[1])
        if (health["updates"] + health["quarantined_batches"] == events
                and health["latest_version"] == health["updates"] // PUBLISH_EVERY):
            return health
        time.sleep(0.05)
    raise AssertionError(f"not settled: {health}")


def _poison(n, seed):
    """Finite but harmful: features forty times the usual scale, every label wrong."""
    x, y = labelled(n, 4, seed=seed)
    return x * 40, (2 - y)


def _prediction(service, x):
    status, body = service.post("/predict", {"x": x.tolist()})
    assert status == 200, body
    answer = json.loads(body)
    return answer["version"], np.array(answer["y"], dtype=np.float32)


def _eager(model, parameters, x):
    reference = Reference(model)
    with torch.no_grad():
        for name, p in reference.model.named_parameters():
            p.copy_(parameters[name])
        return reference.model(torch.from_numpy(x)).numpy()


def _check_replay(log_dir, model, gate_data, regression=MAX_REGRESSION):
    report = replay_mod.replay(log_dir, model, keep_parameters=True)
    assert report.bitwise and report.gate_losses_checked, report.table()
    assert report.unapplied_events == 0
    for row in report.gates:  # no published version is worse than the gate allows
        if row.decision_java == GATE_PUBLISHED:
            assert row.loss_java <= row.serving_loss_java + regression, row
        else:
            assert not row.loss_java <= row.serving_loss_java + regression, row
    result = gradbridge_cli("replay", "--log", log_dir, "--model", model, "--gate-data", gate_data)
    assert result.returncode == 0 and "losses recomputed" in result.stdout, result.stdout + result.stderr
    return report


def test_a_gate_holds_back_poisoned_versions_while_predictions_stay_and_replay_agrees(serve_script, models, tmp_path,
                                                                                      gate_data):
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    good_x, good_y = labelled(120, 4, seed=1)
    bad_x, bad_y = _poison(60, 2)
    probe = good_x[:3]
    with Service(serve_script, model, log_dir, *_options(gate_data)) as service:
        _feed(service, good_x, good_y)
        before = _settle(service, 120)
        assert before["held_versions"] == 0 and before["version"] == 120 // PUBLISH_EVERY, before
        _feed(service, bad_x, bad_y)
        after = _settle(service, 180)
        assert after["held_versions"] > 0, after
        serving, output = _prediction(service, probe)
        assert serving == after["version"] < 180 // PUBLISH_EVERY  # newer versions exist, held back
        metrics = service.get("/metrics")[1]
        for line in (f"gradbridge_held_versions_total {after['held_versions']}.0",
                     f"gradbridge_published_versions_total {after['published_versions']}.0",
                     "gradbridge_gate_loss ", "gradbridge_gate_serving_loss ", "gradbridge_rollbacks_total 0.0"):
            assert line in metrics, line
        service.process.kill()  # SIGKILL: the restart applies the log again, decisions included
        service.process.wait(timeout=30)
    log = replay_mod.read_log(log_dir)
    assert sum(1 for r in log.order if isinstance(r, Gate)) == 180 // PUBLISH_EVERY

    with Service(serve_script, model, log_dir, *_options(gate_data)) as restarted:
        again, output_again = _prediction(restarted, probe)
        assert again == serving and np.array_equal(output_again, output)  # still the version before the poison
        more_x, more_y = labelled(20, 4, seed=3)
        _feed(restarted, more_x, more_y)
        last = _settle(restarted, 200)
        assert last["version"] < last["latest_version"]  # the last version was held back too
        assert restarted.terminate()[0] == 0  # the final checkpoint holds that decision
    with Service(serve_script, model, log_dir, *_options(gate_data)) as once_more:
        assert _prediction(once_more, probe)[0] == serving
        assert once_more.terminate()[0] == 0
    report = _check_replay(log_dir, model, gate_data)
    assert np.array_equal(output, _eager(model, report.parameters[serving], probe))
    held = [row for row in report.gates if row.decision_java != GATE_PUBLISHED]
    assert held and all(row.serving == serving for row in held if row.version <= 180 // PUBLISH_EVERY)


def test_rollback_policy_returns_the_learner_to_the_serving_version(serve_script, models, tmp_path, gate_data):
    """Under --gate-on-hold rollback a held-back version sends the learner back to the serving version
    (parameters and optimizer state): the same poisoned feedback sent twice makes the same version twice,
    bit for bit, held back twice; good feedback afterwards is published again."""
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    options = _options(gate_data, "--gate-on-hold", "rollback", regression=0.01)
    good_x, good_y = labelled(100, 4, seed=4)
    bad_x, bad_y = _poison(PUBLISH_EVERY, 5)  # one version's worth
    with Service(serve_script, model, log_dir, *options) as service:
        _feed(service, good_x, good_y)
        _settle(service, 100)
        _feed(service, bad_x, bad_y)
        _feed(service, bad_x, bad_y)
        held = _settle(service, 100 + 2 * PUBLISH_EVERY)
        serving, _ = _prediction(service, good_x[:1])
        assert serving == held["version"] < held["latest_version"]
        service.process.kill()  # the restart applies the rollbacks again
        service.process.wait(timeout=30)
    log = replay_mod.read_log(log_dir)
    first, second = [r for r in log.order if isinstance(r, Gate)][-2:]
    assert first.decision == second.decision == GATE_ROLLED_BACK and first.serving == second.serving == serving
    assert first.loss == second.loss and first.loss > first.serving_loss, (first, second)

    with Service(serve_script, model, log_dir, *options) as restarted:
        assert _prediction(restarted, good_x[:1])[0] == serving
        more_x, more_y = labelled(40, 4, seed=6)  # training goes on from the serving version and publishes again
        _feed(restarted, more_x, more_y)
        health = _settle(restarted, 150)
        assert health["version"] > serving, health
        assert restarted.terminate()[0] == 0
    report = _check_replay(log_dir, model, gate_data, regression=0.01)
    assert report.serving == health["version"]


def test_admin_rollback_returns_predictions_to_an_earlier_version_and_survives_a_restart(serve_script, models, tmp_path,
                                                                                        gate_data):
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    options = _options(gate_data, "--keep-versions", 4, regression=10)  # a lax gate: every version passes
    x, y = labelled(60, 4, seed=8)
    probe = x[:2]
    with Service(serve_script, model, log_dir, *options) as service:
        _feed(service, x, y)
        health = _settle(service, 60)
        latest = health["version"]
        assert latest == 60 // PUBLISH_EVERY
        status, body = service.post("/admin/rollback", b"")  # no body: the version before the serving one
        assert status == 200 and json.loads(body) == {"version": latest - 1, "kept": [latest - 3, latest - 2, latest - 1]}
        assert _prediction(service, probe)[0] == latest - 1
        status, body = service.post("/admin/rollback", {"version": latest - 3})
        assert status == 200 and json.loads(body)["version"] == latest - 3, body
        for request, code, start in (({"version": latest}, 404, f"error: version {latest} is not a kept published version"),
                                     ({"version": latest - 3}, 409, "error: version"),
                                     ({"version": "3"}, 400, "error: field 'version' must be a version number"),
                                     ({"version": -1}, 400, "error: field 'version' must be a version number"),
                                     ({"to": 3}, 400, "error: unknown field 'to'"),
                                     (b"[1]", 400, "error: body must be a JSON object"),
                                     (b"{}", 409, "error: no version published before the serving version")):
            status, text = service.post("/admin/rollback", request)
            assert status == code and text.startswith(start) and text.count("\n") == 1, (request, status, text)
        status, text = service.post("/admin/rollback", {}, token=False)
        assert status == 401, text
        version, output = _prediction(service, probe)
        assert version == latest - 3
        service.process.kill()
        service.process.wait(timeout=30)

    with Service(serve_script, model, log_dir, *options) as restarted:
        again, output_again = _prediction(restarted, probe)
        assert again == latest - 3 and np.array_equal(output_again, output)
        assert restarted.terminate()[0] == 0
    report = _check_replay(log_dir, model, gate_data, regression=10)
    assert report.rollbacks == 2 and report.serving == latest - 3
    assert np.array_equal(output, _eager(model, report.parameters[latest - 3], probe))
