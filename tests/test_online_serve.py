"""gradbridge-serve over loopback HTTP with real clients (bounded: a few seconds per service).

The service runs in a JVM of its own (serve/build/install/gradbridge-serve), on the pytorch-native-cpu
jar's libtorch; the checks: no 5xx under concurrent predict and feedback clients, one-line 400/413/429
answers with nothing applied, SIGTERM drains and exits 0, every acknowledged event is in the log
and applied, the eager replay reproduces every version, and every prediction equals what its
reported version computes."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from gradbridge import replay as replay_mod
from gradbridge.reference import Reference

from .data import labelled
from .serving import Service


def test_load_with_concurrent_clients_then_sigterm_and_replay(serve_script, models, tmp_path):
    model = models["mlp_classifier.pt"]
    log_dir = tmp_path / "log"
    with Service(serve_script, model, log_dir, "--max-batch", 8, "--max-wait-ms", 3, "--publish-every", 2,
                 "--checkpoint-every", 10, "--queue-capacity", 64, "--predictors", 2, "--fsync", "always") as service:
        x, y = labelled(400, 4, seed=0)
        acknowledged, statuses, predictions = {}, [], []  # acknowledged: event seq -> row of x
        lock = threading.Lock()

        def feedback_client(rows):
            for start in rows:
                while True:
                    status, body = service.post("/feedback", {"x": x[start:start + 5].tolist(),
                                                              "y": y[start:start + 5].tolist()})
                    with lock:
                        statuses.append(status)
                    if status == 200:
                        answer = json.loads(body)
                        with lock:
                            for i in range(answer["accepted"]):
                                acknowledged[answer["first_seq"] + i] = start + i
                        break
                    assert status == 429, body
                    time.sleep(0.005)

        def predict_client(seed):
            rng = np.random.default_rng(seed)
            for _ in range(60):
                row = int(rng.integers(len(x)))
                status, body = service.post("/predict", {"x": x[row:row + 1].tolist()})
                with lock:
                    statuses.append(status)
                assert status == 200, body
                answer = json.loads(body)
                with lock:
                    predictions.append((row, answer["version"], answer["y"]))

        starts = list(range(0, len(x), 5))
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(feedback_client, starts[i::4]) for i in range(4)]
            futures += [pool.submit(predict_client, seed) for seed in range(2)]
            for future in futures:
                future.result(timeout=120)
        assert not [s for s in statuses if s >= 500]
        health = json.loads(service.get("/healthz")[1])
        assert health["status"] == "ok"
        metrics = service.get("/metrics")[1]
        for name in ("gradbridge_model_version ", "gradbridge_queue_depth ", "gradbridge_updates_total ",
                     "gradbridge_quarantined_batches_total 0.0", "gradbridge_training_up 1.0",
                     "gradbridge_predict_latency_seconds_bucket",
                     "gradbridge_learn_latency_seconds_bucket", "gradbridge_feedback_accepted_total 400.0"):
            assert name in metrics, name
        code, out, err = service.terminate()
    assert code == 0, err
    assert "gradbridge-serve: stopped at version" in out

    assert sorted(acknowledged) == list(range(400))
    log = replay_mod.read_log(log_dir)
    assert sorted(log.events) == list(range(400)), "an acknowledged event is missing from the log"
    for seq, row in acknowledged.items():  # logged exactly as sent
        assert log.events[seq] == (x[row].astype("<f4").tobytes(), y[row].astype("<i8").tobytes())
    report = replay_mod.replay(log_dir, model, keep_parameters=True)
    assert report.events == 400 and report.unapplied_events == 0
    assert report.bitwise, report.table()

    reference = Reference(model)
    for row, version, output in predictions:
        with torch.no_grad():
            for name, p in reference.model.named_parameters():
                p.copy_(report.parameters[version][name])
            expected = reference.model(torch.from_numpy(x[row:row + 1])).numpy()
        assert np.array_equal(np.array(output, dtype=np.float32), expected), (row, version)


def test_bad_requests_get_one_line_and_a_full_queue_gets_429(serve_script, models, tmp_path):
    model = models["mlp_classifier.pt"]
    log_dir = tmp_path / "log"
    with Service(serve_script, model, log_dir, "--max-batch", 1000, "--max-wait-ms", 60000,
                 "--queue-capacity", 16, "--max-body-bytes", 4096, "--fsync", "never") as service:
        x, y = labelled(32, 4, seed=1)
        bad = {
            b'{"x": [[1.0, 2.0, 3.0, 4.0]], "y": [0]': "error: body is not valid JSON",
            b'[1, 2]': "error: body must be a JSON object",
            json.dumps({"x": [[1.0, 2.0, 3.0]], "y": [0]}).encode(): "error: input x must be float32 of shape [-1, 4]",
            json.dumps({"x": [[1.0, 2.0, 3.0, 4.0]], "y": [0.5]}).encode(): "error: field 'y' must hold integers",
            json.dumps({"x": [[1.0, 2.0, 3.0, 4.0]], "y": [9]}).encode(): "error: feedback rejected by the model's loss: ",
            json.dumps({"x": [[1.0, 2.0, 3.0, 4.0], [1.0]], "y": [0, 1]}).encode(): "error: field 'x' is not rectangular",
            json.dumps({"x": [[1.0, 2.0, 3.0, 4.0]]}).encode(): "error: field 'y' is missing",
        }
        for body, start in bad.items():
            status, text = service.post("/feedback", body)
            assert status == 400 and text.startswith(start) and text.count("\n") == 1, (body, status, text)
        for route, body in (("/predict", {"x": []}), ("/feedback", {"x": [], "y": []})):
            status, text = service.post(route, body)
            assert status == 400 and text == "error: input x has no rows: send at least one\n", (route, text)
        status, text = service.post("/predict", {"x": [["a", 1, 2, 3]]})
        assert status == 400 and text.startswith("error: field 'x' must be a nested array of numbers")
        status, text = service.post("/feedback", {"x": x.tolist() * 4, "y": y.tolist() * 4})
        assert status == 413 and text.startswith("error: body of ") and text.count("\n") == 1, text

        assert service.post("/feedback", {"x": x[:10].tolist(), "y": y[:10].tolist()})[0] == 200
        status, text = service.post("/feedback", {"x": x[10:20].tolist(), "y": y[10:20].tolist()})
        assert status == 429 and text == "error: the feedback queue is full (10 of 16 events waiting); retry later\n"
        assert service.post("/feedback", {"x": x[10:16].tolist(), "y": y[10:16].tolist()})[0] == 200
        assert "gradbridge_feedback_refused_total 10.0" in service.get("/metrics")[1]
        code, out, err = service.terminate()  # drains the 16 waiting events
    assert code == 0, err
    log = replay_mod.read_log(log_dir)
    assert sorted(log.events) == list(range(16)) and [(b.first_seq, b.count) for b in log.batches] == [(0, 16)]
    assert replay_mod.replay(log_dir, model).bitwise


def test_sigkill_mid_stream_loses_no_acknowledged_event_and_restart_matches_the_replay(serve_script, models, tmp_path):
    model = models["mlp_classifier.pt"]
    log_dir = tmp_path / "log"
    options = ("--max-batch", 4, "--max-wait-ms", 2, "--publish-every", 3, "--checkpoint-every", 4,
               "--fsync", "always", "--predictors", 1)
    x, y = labelled(2000, 4, seed=2)
    acknowledged = {}  # event seq -> row of x
    lock = threading.Lock()
    with Service(serve_script, model, log_dir, *options) as service:
        def feedback_client(rows):
            for start in rows:
                try:
                    status, body = service.post("/feedback", {"x": x[start:start + 2].tolist(),
                                                              "y": y[start:start + 2].tolist()}, timeout=5)
                except (OSError, urllib.error.URLError):
                    return  # the service is gone
                if status == 200:
                    answer = json.loads(body)
                    with lock:
                        for i in range(answer["accepted"]):
                            acknowledged[answer["first_seq"] + i] = start + i

        starts = list(range(0, len(x), 2))
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(feedback_client, starts[i::3]) for i in range(3)]
            deadline = time.monotonic() + 10
            while len(acknowledged) < 300 and time.monotonic() < deadline:
                time.sleep(0.02)
            service.process.kill()  # SIGKILL mid-stream: no drain, no final checkpoint
            service.process.wait(timeout=30)
            for future in futures:
                future.result(timeout=30)
    assert 300 <= len(acknowledged) < 1000, len(acknowledged)
    before = replay_mod.read_log(log_dir)
    assert set(acknowledged) <= set(before.events), "an acknowledged event is missing after SIGKILL"

    with Service(serve_script, model, log_dir, *options) as restarted:
        health = json.loads(restarted.get("/healthz")[1])
        assert health["status"] == "ok"
        code, out, err = restarted.terminate()
    assert code == 0, err
    log = replay_mod.read_log(log_dir)
    assert set(acknowledged) <= set(log.events)
    for seq, row in acknowledged.items():
        assert log.events[seq] == (x[row].astype("<f4").tobytes(), y[row].astype("<i8").tobytes())
    report = replay_mod.replay(log_dir, model)
    assert report.unapplied_events == 0 and report.events == len(log.events)
    assert report.bitwise, report.table()
    checkpoint = json.loads((log_dir / "checkpoint.json").read_text())
    assert checkpoint["version"] == report.rows[-1].version  # the final checkpoint is the last version
