"""Fault suite of the online service (gradbridge-serve): real HTTP clients on 127.0.0.1, real log
files, real signals, a tmpfs for the full disk. Every case ends with `gradbridge replay` over what
was acknowledged (or with replay refusing the same log the service refuses)."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gradbridge import protocol, replay as replay_mod

from .data import labelled
from .faults import gradbridge_cli, one_error_line
from .kafka_support import feedback_records, kafka_broker, kafka_options, wait_for_records
from .serving import Service


def _serve(script, *args):
    return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True, timeout=120)


def _feed(service, n, seed, rows=4, **kwargs):
    x, y = labelled(n, 4, seed=seed)
    acknowledged = 0
    for start in range(0, n, rows):
        status, body = service.post("/feedback", {"x": x[start:start + rows].tolist(), "y": y[start:start + rows].tolist()},
                                    **kwargs)
        assert status == 200, body
        acknowledged += json.loads(body)["accepted"]
    return acknowledged


def _replay_bitwise(log_dir, model, events):
    report = replay_mod.replay(log_dir, model)
    assert report.bitwise, report.table()
    assert report.events + sum(b.count for b in replay_mod.read_log(log_dir).quarantines) == events
    result = gradbridge_cli("replay", "--log", log_dir, "--model", model)
    assert result.returncode == 0, result.stdout + result.stderr
    return report


def test_a_second_service_on_the_same_log_is_refused_and_the_first_keeps_everything(serve_script, models, tmp_path):
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never") as first:
        acknowledged = _feed(first, 40, 0)
        second = _serve(serve_script, "--model", model, "--log", log_dir, "--port", 0)
        assert "is in use by another process" in one_error_line(second)
        acknowledged += _feed(first, 40, 1)
        code, _, err = first.terminate()
    assert code == 0, err
    _replay_bitwise(log_dir, model, acknowledged)


def test_damage_in_the_middle_refuses_to_start_touches_nothing_and_replay_fails_alike(serve_script, models, tmp_path):
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never", "--checkpoint-every", 1000) as service:
        acknowledged = _feed(service, 80, 2)
        assert service.terminate()[0] == 0
    _replay_bitwise(log_dir, model, acknowledged)
    log_file = log_dir / "feedback.log"
    data = bytearray(log_file.read_bytes())
    offsets = [offset for offset, _ in replay_mod.frames(log_file, bytes(data))]
    middle = offsets[len(offsets) // 2]
    data[middle + 20] ^= 0x01
    log_file.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in log_dir.iterdir()}

    refused = _serve(serve_script, "--model", model, "--log", log_dir, "--port", 0)
    line = one_error_line(refused)
    assert f"{log_file}: offset {middle}: the record's checksum does not match" in line, line
    assert {p.name: p.read_bytes() for p in log_dir.iterdir()} == before, "a refused start changed the folder"
    result = gradbridge_cli("replay", "--log", log_dir, "--model", model)
    assert one_error_line(result, "gradbridge: error: ") .endswith(f"offset {middle}: the record's checksum does not match")

    # The documented way out: recover the whole records before the damage into a new folder.
    recovered = tmp_path / "recovered"
    result = gradbridge_cli("recover-log", "--log", log_dir, "--into", recovered)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"offset {middle}" in result.stdout
    kept = replay_mod.read_log(recovered)
    assert max(kept.events) < kept.header["seq_floor"]
    with Service(serve_script, model, recovered, "--fsync", "never") as restarted:
        status, body = restarted.post("/feedback", {"x": [[0.0, 0.0, 0.0, 0.0]], "y": [1]})
        assert status == 200 and json.loads(body)["first_seq"] >= kept.header["seq_floor"], body  # never reused
        assert restarted.terminate()[0] == 0
    report = replay_mod.replay(recovered, model)
    assert report.bitwise and report.unapplied_events == 0, report.table()


def test_a_log_of_another_model_or_a_contradicting_checkpoint_is_refused(serve_script, models, tmp_path):
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never", "--checkpoint-every", 1) as service:
        acknowledged = _feed(service, 20, 3)
        assert service.terminate()[0] == 0
    other = models["mlp_regressor.pt"]
    line = one_error_line(_serve(serve_script, "--model", other, "--log", log_dir, "--port", 0))
    assert "offset 0: it was written for the module with SHA-256" in line and "another --model" in line, line
    with pytest.raises(replay_mod.LogError, match="offset 0: it was written for the module"):
        replay_mod.replay(log_dir, other)
    _replay_bitwise(log_dir, model, acknowledged)

    log_file = log_dir / "feedback.log"
    whole = log_file.read_bytes()
    log_file.write_bytes(whole[:len(whole) // 3])  # cut behind the checkpoint's back
    line = one_error_line(_serve(serve_script, "--model", model, "--log", log_dir, "--port", 0))
    assert "the log was cut or replaced" in line, line
    with pytest.raises(replay_mod.LogError, match="the log was cut or replaced"):
        replay_mod.replay(log_dir, model)


def test_poisoned_feedback_is_quarantined_counted_and_replayed_alike(serve_script, models, tmp_path):
    model, log_dir = models["mlp_regressor.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never", "--max-batch", 1, "--max-wait-ms", 0) as service:
        rng = np.random.default_rng(4)
        good = [(rng.standard_normal((1, 4)).tolist(), [[0.5]]) for _ in range(6)]
        for x, y in good[:3]:
            assert service.post("/feedback", {"x": x, "y": y})[0] == 200
        status, body = service.post("/feedback", {"x": [[1, 1, 1, 1]], "y": [[3e38]]})  # loss overflows
        assert status == 200, body
        for x, y in good[3:]:
            assert service.post("/feedback", {"x": x, "y": y})[0] == 200
        status, body = service.post("/feedback", {"x": [[1e39, 1, 1, 1]], "y": [[1]]})  # not a float32
        assert status == 400 and body.startswith("error: feedback holds NaN or infinite values"), body
        code, _, err = service.terminate()
    assert code == 0, err
    log = replay_mod.read_log(log_dir)
    assert [q.first_seq for q in log.quarantines] == [3] and log.quarantines[0].reason.startswith("loss is")
    report = _replay_bitwise(log_dir, model, 7)
    assert report.quarantined == 1 and report.batches == 6
    with Service(serve_script, model, log_dir, "--fsync", "never") as restarted:
        status, body = restarted.post("/predict", {"x": [[1.0, 2.0, 3.0, 4.0]]})
        assert status == 200 and all(np.isfinite(json.loads(body)["y"][0])), body
        assert "gradbridge_quarantined_batches_total 0.0" in restarted.get("/metrics")[1]
        assert restarted.terminate()[0] == 0


def test_token_by_default_idempotent_retries_across_a_restart(serve_script, models, tmp_path):
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "always") as service:
        assert oct((log_dir / "serve.key").stat().st_mode & 0o777) == "0o600"
        body = {"x": [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]], "y": [0, 2]}
        for token in (False,):
            status, text = service.post("/feedback", body, token=token)
            assert status == 401 and text.startswith("error: missing or wrong token") and text.count("\n") == 1, text
        status, text = service.post("/predict", body, headers={"Authorization": "Bearer wrong"}, token=False)
        assert status == 401, text
        key = {"Idempotency-Key": "order-17"}
        first = json.loads(service.post("/feedback", body, headers=key)[1])
        again = json.loads(service.post("/feedback", body, headers=key)[1])
        assert first["first_seq"] == again["first_seq"] and again["duplicate"] and not first["duplicate"]
        status, text = service.post("/feedback", {"x": body["x"], "y": [1, 1]}, headers=key)
        assert status == 422 and "was used for another request" in text, text
        assert service.terminate()[0] == 0
    with Service(serve_script, model, log_dir, "--fsync", "always") as restarted:
        after = json.loads(restarted.post("/feedback", body, headers={"Idempotency-Key": "order-17"})[1])
        assert after["duplicate"] and after["first_seq"] == first["first_seq"]
        assert restarted.terminate()[0] == 0
    assert sorted(replay_mod.read_log(log_dir).events) == [0, 1]  # applied once
    _replay_bitwise(log_dir, model, 2)


def _last_request_write(log_file):
    """The log's bytes and its last request's write: (data, its W record's offset, the W frame's end, the write's end,
    each frame's end in the write)."""
    data = log_file.read_bytes()
    start = [offset for offset, payload in replay_mod.frames(log_file, data) if payload[:1] == b"W"][-1]
    (length,) = struct.unpack_from("<I", data, start)
    w_end = start + replay_mod.FRAME_HEADER + length
    (following,) = struct.unpack_from("<q", data, w_end - 8)
    ends, at = [], w_end
    while at < w_end + following:
        at += replay_mod.FRAME_HEADER + struct.unpack_from("<I", data, at)[0]
        ends.append(at)
    return data, start, w_end, w_end + following, ends


@pytest.mark.parametrize("every_cut", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_request_torn_anywhere_in_its_write_is_cut_whole_and_its_retry_applied_once(serve_script, models, tmp_path,
                                                                                       every_cut):
    """A crash that tears one request's write (its W record, events and key) leaves no event without its key and no key
    without its events: both readers cut the whole write as a torn tail; the client, never answered, retries with its
    key and the request is applied once; every acknowledged event is applied exactly once and replay is bitwise."""
    model, whole_dir = models["mlp_classifier.pt"], tmp_path / "whole"
    x, y = labelled(30, 4, seed=21)
    requests = [({"x": x[i:i + 3].tolist(), "y": y[i:i + 3].tolist()}, {"Idempotency-Key": f"req-{i // 3}"})
                for i in range(0, 30, 3)]
    # events wait in the queue (nothing applied), so the last request's write ends the log when the service is killed
    with Service(serve_script, model, whole_dir, "--fsync", "always", "--max-batch", 64,
                 "--max-wait-ms", 600_000) as service:
        for body, key in requests:
            status, text = service.post("/feedback", body, headers=key)
            assert status == 200 and json.loads(text)["accepted"] == 3, text
        service.process.kill()
        service.process.wait(timeout=30)
    log_file = whole_dir / replay_mod.FILE_NAME
    data, start, w_end, write_end, ends = _last_request_write(log_file)
    assert write_end == len(data) and len(ends) == 4, "the last request's write (3 events, a key) does not end the log"
    whole = replay_mod.read_log(whole_dir)
    first, count = whole.keys["req-9"]
    last = set(range(first, first + count))
    assert len(last) == 3 and last <= set(whole.events)
    # a log of an earlier version (no W records) reads as before
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    (old_dir / replay_mod.FILE_NAME).write_bytes(b"".join(replay_mod.frame(payload) for _, payload
                                                          in replay_mod.frames(log_file, data) if payload[:1] != b"W"))
    old = replay_mod.read_log(old_dir)
    assert (old.events, old.keys, old.torn_bytes) == (whole.events, whole.keys, 0)
    # the reader (Python here, Java on start) cuts the whole write wherever it is torn
    reader_dir = tmp_path / "reader"
    reader_dir.mkdir()
    for cut in range(start + 1, write_end):
        (reader_dir / replay_mod.FILE_NAME).write_bytes(data[:cut])
        torn = replay_mod.read_log(reader_dir)
        assert (torn.end, torn.torn_bytes) == (start, cut - start), cut
        assert not last & set(torn.events) and "req-9" not in torn.keys and len(torn.events) == 27, cut
    # restarted on the torn log: the retry is applied once, the 27 acknowledged events too, bitwise
    cuts = [ends[-2]] if not every_cut else [start + 1, w_end - 1, w_end, w_end + 5, ends[0], ends[1] + 20, ends[-2],
                                             write_end - 1]
    for cut in cuts:
        log_dir = tmp_path / f"cut-{cut}"
        log_dir.mkdir()
        (log_dir / replay_mod.FILE_NAME).write_bytes(data[:cut])
        with Service(serve_script, model, log_dir, "--fsync", "always", "--max-batch", 4,
                     "--max-wait-ms", 1) as restarted:
            answers = [json.loads(restarted.post("/feedback", body, headers=key)[1]) for body, key in requests[-2:]]
            assert answers[0]["duplicate"] and answers[0]["first_seq"] == whole.keys["req-8"][0], answers
            assert not answers[1]["duplicate"] and answers[1]["accepted"] == 3, answers  # the torn one, logged anew
            code, _, err = restarted.terminate()
        assert code == 0, err
        assert f"cut a torn tail of {cut - start} bytes at offset {start}" in err, err
        log = replay_mod.read_log(log_dir)
        assert len(log.keys) == 10 and len(log.events) == 30, (cut, sorted(log.keys))
        for body, key in requests:
            first, count = log.keys[key["Idempotency-Key"]]
            assert [log.events[first + i][0] for i in range(count)] == [np.asarray(r, np.float32).tobytes()
                                                                          for r in body["x"]], (cut, key)
        applied = sorted(s for b in log.batches for s in range(b.first_seq, b.first_seq + b.count))
        assert applied == sorted(log.events), f"cut at {cut}: an event applied twice or never"
        _replay_bitwise(log_dir, model, 30)


def test_bad_options_and_a_port_in_use_leave_nothing_behind(serve_script, models, tmp_path):
    model = models["mlp_classifier.pt"]
    for args, expected in ((("--max-body-bytes", -5), "--max-body-bytes must be in 1..1073741824, got -5"),
                           (("--port", 70000), "--port must be in 0..65535"),
                           (("--fsync", "sometimes"), "unknown fsync policy 'sometimes'"),
                           (("--max-grad-norm", "-1"), "max grad norm must be a finite number >= 0, got -1.0"),
                           (("--group-commit-ms", "-1"), "--group-commit-ms must be in 0..3600000, got -1"),
                           (("--max-batch", "x"), "Invalid value for option '--max-batch'"),
                           (("--port", 18765, "--admin-port", 18765), "--admin-port 18765 is --port's")):
        log_dir = tmp_path / f"log{len(expected)}"
        result = _serve(serve_script, "--model", model, "--log", log_dir, *args)
        assert expected in one_error_line(result), result.stderr
        assert not log_dir.exists()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        log_dir = tmp_path / "busy"
        result = _serve(serve_script, "--model", model, "--log", log_dir, "--port", busy.getsockname()[1])
        assert "cannot listen on 127.0.0.1:" in one_error_line(result)
        assert not log_dir.exists()


def test_chunked_body_over_the_limit_and_unknown_routes_are_one_line_4xx(serve_script, models, tmp_path):
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--max-body-bytes", 4096, "--fsync", "never") as service:
        host, port = service.url.split("//")[1].split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        chunk = b'{"x": [' + b"[1.0, 2.0, 3.0, 4.0], " * 400 + b'[1.0, 2.0, 3.0, 4.0]], "y": [0]}'
        connection.request("POST", "/feedback", body=iter([chunk[i:i + 1000] for i in range(0, len(chunk), 1000)]),
                           headers={"Authorization": f"Bearer {service.token}", "Transfer-Encoding": "chunked"},
                           encode_chunked=True)
        response = connection.getresponse()
        text = response.read().decode()
        assert response.status == 413 and text.startswith("error: body exceeds the limit of 4096 bytes"), text
        status, text = service.post("/nowhere", {"x": 1})
        assert status == 404 and text.startswith("error: no route POST /nowhere") and text.count("\n") == 1, text
        acknowledged = _feed(service, 8, 5)
        assert service.terminate()[0] == 0
    _replay_bitwise(log_dir, model, acknowledged)


# ---- a full disk (a real tmpfs), a dead training thread, SIGTERM under load, slow clients ----

@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs mounted for the test (these machines run the suite as root)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _copy_to_disk(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("feedback.lock"))
    return target


def test_a_full_disk_logs_a_request_whole_or_not_at_all_and_a_restart_applies_exactly_the_acknowledged(
        serve_script, models, tmp_path, small_disk):
    model, log_dir = models["mlp_classifier.pt"], small_disk / "log"
    # Training waits (B=10^6, T=60 s): only the requests' own writes fill the disk.
    with Service(serve_script, model, log_dir, "--fsync", "always", "--max-batch", 1_000_000,
                 "--max-wait-ms", 60_000, "--queue-capacity", 1_000_000, "--checkpoint-every", 1000,
                 "--max-body-bytes", 1 << 22) as service:
        x, y = labelled(200, 4, seed=6)
        acknowledged, refusals = 0, []
        for _ in range(200):
            status, body = service.post("/feedback", {"x": x.tolist(), "y": y.tolist()})
            if status == 200:
                assert json.loads(body)["first_seq"] == acknowledged
                acknowledged += 200
            else:
                refusals.append((status, body))
                if len(refusals) == 2:
                    break
        assert refusals, "the disk never filled"
        for status, body in refusals:
            assert status == 503 and "nothing of this request was logged" in body and body.count("\n") == 1, body
        logged = replay_mod.read_log(log_dir)
        assert sorted(logged.events) == list(range(acknowledged)) and logged.torn_bytes == 0  # whole requests only
        assert json.loads(service.get("/healthz")[1])["status"] == "ok"  # still serving
        code, _, err = service.terminate()  # the drain needs the disk: it cannot continue
    line = one_error_line(subprocess.CompletedProcess([], code, "", err))
    assert line.startswith("training stopped, the service cannot continue:") and "No space left on device" in line, err

    moved = _copy_to_disk(log_dir, tmp_path / "moved")  # the operator frees space (here: moves the folder)
    with Service(serve_script, model, moved, "--fsync", "always") as restarted:
        assert restarted.terminate()[0] == 0
    report = _replay_bitwise(moved, model, acknowledged)
    assert report.unapplied_events == 0


def test_a_dead_training_thread_answers_503_and_the_service_exits_1(serve_script, models, tmp_path, small_disk):
    model, log_dir = models["mlp_classifier.pt"], small_disk / "log"
    # A checkpoint every version: the training thread fills the disk.
    with Service(serve_script, model, log_dir, "--fsync", "never", "--max-batch", 4, "--max-wait-ms", 0,
                 "--checkpoint-every", 1) as service:
        x, y = labelled(4, 4, seed=7)
        acknowledged, health = 0, None
        for _ in range(2000):  # until a checkpoint no longer fits beside the growing log
            status, body = service.post("/feedback", {"x": x.tolist(), "y": y.tolist()})
            if status == 200:
                acknowledged += 4
            status, text = service.get("/healthz")
            if status == 503:
                health = json.loads(text)
                break
        assert health is not None and health["status"] == "failed" and "training stopped" in health["error"], health
        assert service.process.wait(timeout=30) == 1
        err = service.process.stderr.read()
        assert one_error_line(subprocess.CompletedProcess([], 1, "", err)).startswith("training stopped"), err
    moved = _copy_to_disk(log_dir, tmp_path / "moved")
    with Service(serve_script, model, moved, "--fsync", "never") as restarted:
        assert restarted.terminate()[0] == 0
    _replay_bitwise(moved, model, acknowledged)


def test_sigterm_under_load_answers_every_logged_request(serve_script, models, tmp_path):
    import threading
    import urllib.error

    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "always", "--max-batch", 8, "--max-wait-ms", 2) as service:
        x, y = labelled(4000, 4, seed=8)
        acknowledged, lock, stop = set(), threading.Lock(), threading.Event()

        def client(rows):
            for start in rows:
                if stop.is_set():
                    return
                try:
                    status, body = service.post("/feedback", {"x": x[start:start + 2].tolist(),
                                                              "y": y[start:start + 2].tolist()}, timeout=30)
                except (OSError, urllib.error.URLError):
                    continue  # refused or reset: never logged (checked below)
                if status == 200:
                    answer = json.loads(body)
                    with lock:
                        acknowledged.update(range(answer["first_seq"], answer["first_seq"] + answer["accepted"]))

        starts = list(range(0, len(x), 2))
        threads = [threading.Thread(target=client, args=(starts[i::6],)) for i in range(6)]
        try:
            for thread in threads:
                thread.start()
            import time

            deadline = time.monotonic() + 30
            while len(acknowledged) < 300 and time.monotonic() < deadline:
                time.sleep(0.01)
            service.process.send_signal(15)
            code = service.process.wait(timeout=60)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        finally:
            stop.set()
    assert code == 0, service.process.stderr.read()
    logged = replay_mod.read_log(log_dir)
    assert set(logged.events) == acknowledged, "a request was logged but its client got no answer"
    _replay_bitwise(log_dir, model, len(acknowledged))


def test_group_commit_publishes_only_durable_versions_through_a_sigkill(serve_script, models, tmp_path):
    """fsync always with a long group-commit delay: versions wait for a shared fsync, training does
    not. After a SIGKILL the log holds every acknowledged event and every version a prediction was
    answered from; the restart resumes and replay is bitwise."""
    import threading
    import urllib.error

    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    options = ("--fsync", "always", "--group-commit-ms", 20, "--max-batch", 4, "--max-wait-ms", 1)
    with Service(serve_script, model, log_dir, *options) as service:
        x, y = labelled(4000, 4, seed=9)
        acknowledged, answered_versions, lock, stop = set(), set(), threading.Lock(), threading.Event()

        def feedback(rows):
            for start in rows:
                if stop.is_set():
                    return
                try:
                    status, body = service.post("/feedback", {"x": x[start:start + 2].tolist(),
                                                              "y": y[start:start + 2].tolist()}, timeout=10)
                except (OSError, urllib.error.URLError):
                    return  # the service is gone
                if status == 200:
                    answer = json.loads(body)
                    with lock:
                        acknowledged.update(range(answer["first_seq"], answer["first_seq"] + answer["accepted"]))

        def predict():
            while not stop.is_set():
                try:
                    status, body = service.post("/predict", {"x": x[:1].tolist()}, timeout=10)
                except (OSError, urllib.error.URLError):
                    return
                if status == 200:
                    with lock:
                        answered_versions.add(json.loads(body)["version"])

        starts = list(range(0, len(x), 2))
        threads = [threading.Thread(target=feedback, args=(starts[i::4],)) for i in range(4)]
        threads.append(threading.Thread(target=predict))
        try:
            for thread in threads:
                thread.start()
            import time

            deadline = time.monotonic() + 30
            while (len(acknowledged) < 300 or len(answered_versions) < 5) and time.monotonic() < deadline:
                time.sleep(0.01)
            service.process.kill()  # SIGKILL: versions waiting for the group commit are lost, never answered
            service.process.wait(timeout=30)
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
        finally:
            stop.set()
    assert len(acknowledged) >= 300 and len(answered_versions) >= 5
    before = replay_mod.read_log(log_dir)
    assert acknowledged <= set(before.events), "an acknowledged event is missing after SIGKILL"
    assert answered_versions <= {v.id for v in before.versions}, "a prediction came from a version the log lost"

    with Service(serve_script, model, log_dir, *options) as restarted:
        code, _, err = restarted.terminate()
    assert code == 0, err
    _replay_bitwise(log_dir, model, len(replay_mod.read_log(log_dir).events))


def test_slow_clients_cannot_starve_health_checks(serve_script, models, tmp_path):
    import time

    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never", "--threads", 8, "--read-timeout-ms", 1500,
                 "--admin-port", 0) as service:
        assert service.admin_url and service.admin_url.startswith("http://127.0.0.1:")
        host, port = service.url.split("//")[1].split(":")
        stalled = []
        try:
            assert service.post("/healthz", {})[0] == 404  # not on the main port when --admin-port is given
            for _ in range(60):  # each sends its headers and one byte of a 1000-byte body, then nothing
                s = socket.create_connection((host, int(port)), timeout=10)
                s.sendall(f"POST /feedback HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {service.token}\r\n"
                          "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode())
                stalled.append(s)
            started = time.monotonic()
            status, text = service.get("/healthz", timeout=5)  # its own server and threads
            assert status == 200 and time.monotonic() - started < 2, text
            time.sleep(3)  # past the read timeout: the stalled connections are closed
            for s in stalled:
                s.settimeout(5)
                try:
                    assert s.recv(4096) is not None
                except OSError:
                    pass
            status, body = service.post("/predict", {"x": [[0.0, 0.0, 0.0, 0.0]]}, timeout=5)
            assert status == 200, body
            acknowledged = _feed(service, 8, 9)
            assert service.terminate()[0] == 0
        finally:
            for s in stalled:
                s.close()
    _replay_bitwise(log_dir, model, acknowledged)


def test_out_of_range_embedding_ids_and_a_corrupt_checkpoint_get_one_line(serve_script, tmp_path):
    from gradbridge.recommender import export

    model = export(tmp_path / "recommender.pt", users=5, items=4, dim=2, lr=0.05)
    log_dir = tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never", "--checkpoint-every", 1) as service:
        status, text = service.post("/predict", {"x": [[1, 9]]})
        assert status == 400 and text.startswith("error: x rejected by the model: ") and text.count("\n") == 1, text
        assert "java." not in text and "dev.gradbridge." not in text and "Exception" not in text, text
        status, text = service.post("/feedback", {"x": [[7, 1]], "y": [[1.0]]})
        assert status == 400 and text.startswith("error: feedback rejected by the model's loss: "), text
        assert "java." not in text and "dev.gradbridge." not in text, text
        status, body = service.post("/feedback", {"x": [[1, 2], [3, 0]], "y": [[1.0], [0.0]]})
        assert status == 200, body
        assert service.terminate()[0] == 0
    _replay_bitwise(log_dir, model, 2)
    checkpoint = next(log_dir.glob("checkpoint-v*.pt"))
    checkpoint.write_bytes(b"not a module")
    line = one_error_line(_serve(serve_script, "--model", model, "--log", log_dir, "--port", 0))
    assert str(checkpoint) in line, line


def _keystore(folder: Path, password: str = "keystore-pass-1"):
    """A PKCS12 keystore made by the JDK's keytool (a key pair for 127.0.0.1), its password file and certificate."""
    import shutil

    keytool = shutil.which("keytool")
    assert keytool, "keytool (the JDK's) is needed"
    keystore, certificate, password_file = folder / "server.p12", folder / "server.pem", folder / "tls.password"
    subprocess.run([keytool, "-genkeypair", "-alias", "serve", "-keyalg", "EC", "-groupname", "secp256r1", "-validity", "2",
                    "-dname", "CN=localhost", "-ext", "san=ip:127.0.0.1,dns:localhost", "-storetype", "PKCS12",
                    "-keystore", str(keystore), "-storepass", password, "-keypass", password],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([keytool, "-exportcert", "-rfc", "-alias", "serve", "-keystore", str(keystore), "-storepass", password,
                    "-file", str(certificate)], check=True, capture_output=True, timeout=120)
    password_file.write_text(password + "\n")
    return keystore, password_file, certificate


def test_https_from_a_keystore_serves_a_verifying_client_and_plain_http_gets_nothing(serve_script, models, tmp_path):
    import ssl
    import urllib.error
    import urllib.request

    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    keystore, password_file, certificate = _keystore(tmp_path)
    with Service(serve_script, model, log_dir, "--fsync", "never", "--tls-keystore", keystore,
                 "--tls-password-file", password_file) as service:
        assert service.url.startswith("https://127.0.0.1:")
        service.context = ssl.create_default_context(cafile=str(certificate))  # verifies the chain and 127.0.0.1
        acknowledged = _feed(service, 40, 3)
        status, body = service.post("/predict", {"x": labelled(1, 4, seed=4)[0].tolist()})
        assert status == 200 and "version" in json.loads(body)
        with pytest.raises((urllib.error.URLError, ssl.SSLError)):  # a client that does not trust the certificate
            urllib.request.urlopen(urllib.request.Request(service.url + "/healthz"), timeout=10,
                                   context=ssl.create_default_context())
        plain = http.client.HTTPConnection("127.0.0.1", int(service.url.rsplit(":", 1)[1]), timeout=10)
        try:
            plain.request("GET", "/healthz")
            status = plain.getresponse().status
        except (OSError, http.client.HTTPException):
            status = None  # the TLS handshake fails and the connection closes
        assert status in (None, 400), status  # plain HTTP on the TLS port: never an answer
        code, _, err = service.terminate()
    assert code == 0, err
    _replay_bitwise(log_dir, model, acknowledged)


def test_a_bad_keystore_or_password_is_one_line_and_leaves_nothing(serve_script, models, tmp_path, monkeypatch):
    model = models["mlp_classifier.pt"]
    keystore, password_file, _ = _keystore(tmp_path)
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    garbage = tmp_path / "garbage.p12"
    garbage.write_bytes(b"\x00" * 100)
    monkeypatch.delenv("GRADBRIDGE_TEST_TLS_UNSET", raising=False)
    for args, expected in (
            (("--tls-keystore", keystore, "--tls-password-file", wrong), "keystore password was incorrect"),
            (("--tls-keystore", garbage, "--tls-password-file", password_file), f"cannot open keystore {garbage}"),
            (("--tls-keystore", tmp_path / "missing.p12", "--tls-password-file", password_file), "no keystore at"),
            (("--tls-keystore", keystore), "needs its password from --tls-password-file FILE or --tls-password-env"),
            (("--tls-keystore", keystore, "--tls-password-env", "GRADBRIDGE_TEST_TLS_UNSET"),
             "environment variable GRADBRIDGE_TEST_TLS_UNSET is not set (--tls-password-env)"),
            (("--tls-password-file", password_file), "need --tls-keystore")):
        log_dir = tmp_path / f"log{len(expected)}"
        result = _serve(serve_script, "--model", model, "--log", log_dir, *args)
        assert expected in one_error_line(result), result.stderr
        assert "not-the-password" not in result.stderr and "keystore-pass-1" not in result.stderr
        assert not log_dir.exists()
    # The password from the environment works like the file; replay over what was acknowledged.
    log_dir = tmp_path / "log"
    monkeypatch.setenv("GRADBRIDGE_TEST_TLS_PASSWORD", "keystore-pass-1")
    with Service(serve_script, model, log_dir, "--fsync", "always", "--tls-keystore", keystore,
                 "--tls-password-env", "GRADBRIDGE_TEST_TLS_PASSWORD") as service:
        import ssl

        service.context = ssl.create_default_context(cafile=str(tmp_path / "server.pem"))
        acknowledged = _feed(service, 20, 5)
        code, _, err = service.terminate()
    assert code == 0, err
    _replay_bitwise(log_dir, model, acknowledged)


# ---- issue 34: extreme feedback, slow clients, checkpoints, tokens, options, Jetty's own answers ----

def _assert_predicts_numbers(service):
    status, body = service.post("/predict", {"x": [[0.1, 0.2, 0.3, 0.4]]})
    assert status == 200 and all(v is not None for v in json.loads(body)["y"][0]), body


def _post_extreme_feedback(serve_script, model, log_dir, requests):
    """Serve ``model`` with micro-batches of one event and the input magnitude limit off (it would refuse
    extreme features first: off, to reach the update guard behind it), post each ``(x, y)`` feedback request
    (each answered 200), check predictions are still numbers, stop cleanly; the log it wrote."""
    with Service(serve_script, model, log_dir, "--fsync", "never", "--max-batch", 1, "--max-wait-ms", 0,
                 "--max-input-abs", 0) as service:
        for x, y in requests:
            status, body = service.post("/feedback", {"x": x, "y": y})
            assert status == 200, body
        _assert_predicts_numbers(service)
        code, _, err = service.terminate()
    assert code == 0, err
    return replay_mod.read_log(log_dir)


def _restart_predicts_numbers(serve_script, model, log_dir):
    """A restart on the log resumes through the same decisions: predictions are numbers, the stop clean."""
    with Service(serve_script, model, log_dir, "--fsync", "never") as restarted:
        _assert_predicts_numbers(restarted)
        assert restarted.terminate()[0] == 0


def test_extreme_features_are_quarantined_the_model_stays_finite_and_replay_agrees(serve_script, models, tmp_path):
    """3e38 features on a classifier: loss and gradients are finite, the Adam update is not. The step is
    undone (the model stays as it was), the micro-batch quarantined, predictions stay numbers."""
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    log = _post_extreme_feedback(serve_script, model, log_dir, [
        ([[0.1, 0.2, 0.3, 0.4]], [0]), ([[3e38, -3e38, 3e38, 3e38]], [1]), ([[-3e38, 3e38, 3e38, -3e38]], [2]),
        ([[0.5, 0.6, 0.7, 0.8]], [1]),
        # One request of four events: applied as one run of micro-batches, the bad one in its middle.
        ([[0.2, 0.1, 0.4, 0.3], [3e38, 3e38, -3e38, 3e38], [0.3, 0.3, 0.1, 0.2], [0.9, 0.1, 0.5, 0.2]], [0, 2, 1, 2])])
    assert [q.first_seq for q in log.quarantines] == [1, 2, 5], log.quarantines
    assert all(q.reason.startswith("the update makes ") and q.reason.endswith(" not finite") for q in log.quarantines)
    report = _replay_bitwise(log_dir, model, 8)
    assert report.quarantined == 3 and report.batches == 5
    _restart_predicts_numbers(serve_script, model, log_dir)


def test_slow_clients_on_the_main_port_cannot_starve_health_checks_or_predictions(serve_script, models, tmp_path):
    """Clients that send their headers and then a byte of body now and then hold no handler thread
    (bodies are read before a handler runs) and are cut below --min-body-rate: /healthz and
    /predict on the same port keep answering, with 8 threads and 60 such clients."""
    import threading
    import time

    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never", "--threads", 8,
                 "--read-timeout-ms", 3000) as service:
        host, port = service.url.split("//")[1].split(":")
        stop, answers, lock = threading.Event(), [], threading.Lock()

        def dribble(s):
            try:
                s.sendall(f"POST /feedback HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {service.token}\r\n"
                          "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode())
                while not stop.is_set():
                    time.sleep(0.5)
                    s.sendall(b" ")
            except OSError:
                pass
            try:
                s.settimeout(5)
                text = s.recv(4096).decode(errors="replace")
            except OSError:
                text = ""
            with lock:
                answers.append(text)

        sockets = [socket.create_connection((host, int(port)), timeout=10) for _ in range(60)]
        threads = [threading.Thread(target=dribble, args=(s,)) for s in sockets]
        try:
            for thread in threads:
                thread.start()
            time.sleep(1)
            for _ in range(3):
                started = time.monotonic()
                status, text = service.get("/healthz", timeout=5)
                assert status == 200 and time.monotonic() - started < 2, text
                started = time.monotonic()
                status, body = service.post("/predict", {"x": [[0.0, 0.0, 0.0, 0.0]]}, timeout=5)
                assert status == 200 and time.monotonic() - started < 2, body
                time.sleep(0.5)
            acknowledged = _feed(service, 8, 9)
            stop.set()
            for thread in threads:
                thread.join(timeout=20)
            refused = [a for a in answers if a.startswith("HTTP/1.1 408")]
            assert refused and all("\r\n\r\nerror: the request body arrived too slowly" in a for a in refused), \
                answers[:3]
            assert service.terminate()[0] == 0
        finally:
            stop.set()
            for s in sockets:
                s.close()
    _replay_bitwise(log_dir, model, acknowledged)


def _damage_an_entry(archive: Path) -> str:
    """Flips a byte inside the largest entry of a zip, keeping the archive's structure (libtorch's
    reader checks no CRC); returns the entry's name."""
    import zipfile

    with zipfile.ZipFile(archive) as z:
        info = max(z.infolist(), key=lambda i: i.compress_size)
    data = bytearray(archive.read_bytes())
    header = info.header_offset
    start = header + 30 + int.from_bytes(data[header + 26:header + 28], "little") + int.from_bytes(data[header + 28:header + 30], "little")
    data[start + info.compress_size // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    return info.filename


def test_a_damaged_checkpoint_or_module_is_refused_at_start_naming_the_file(serve_script, models, tmp_path):
    import shutil

    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never", "--checkpoint-every", 1) as service:
        acknowledged = _feed(service, 12, 11)
        assert service.terminate()[0] == 0
    checkpoint = next(log_dir.glob("checkpoint-v*.pt"))
    entry = _damage_an_entry(checkpoint)
    before = {p.name: p.read_bytes() for p in log_dir.iterdir()}
    line = one_error_line(_serve(serve_script, "--model", model, "--log", log_dir, "--port", 0))
    assert f"checkpoint {checkpoint}" in line and "is damaged" in line and entry in line, line
    assert {p.name: p.read_bytes() for p in log_dir.iterdir()} == before, "a refused start changed the folder"
    # What the line says to do: without the descriptor the whole log is applied again.
    (log_dir / "checkpoint.json").rename(tmp_path / "checkpoint.json")
    with Service(serve_script, model, log_dir, "--fsync", "never") as restarted:
        assert restarted.terminate()[0] == 0
    _replay_bitwise(log_dir, model, acknowledged)

    damaged = tmp_path / "damaged.pt"
    shutil.copy(model, damaged)
    _damage_an_entry(damaged)
    line = one_error_line(_serve(serve_script, "--model", damaged, "--log", tmp_path / "fresh", "--port", 0))
    assert f"training module {damaged} is damaged" in line, line
    assert not (tmp_path / "fresh").exists()


def test_token_rules(serve_script, models, tmp_path, monkeypatch):
    model = models["mlp_classifier.pt"]
    long_token = tmp_path / "long.token"
    long_token.write_text("t" * 100_000)
    long_token.chmod(0o600)
    monkeypatch.setenv("GRADBRIDGE_TEST_SHORT_TOKEN", "short")
    for args, expected in ((("--token-file", long_token), "must be 16 to 1024 visible ASCII characters, got 100000"),
                           (("--token-env", "GRADBRIDGE_TEST_SHORT_TOKEN"), "must be 16 to 1024 visible ASCII characters")):
        log_dir = tmp_path / f"log{len(expected)}"
        result = _serve(serve_script, "--model", model, "--log", log_dir, "--port", 0, *args)
        assert expected in one_error_line(result), result.stderr
        assert not result.stderr.startswith("Error") and not log_dir.exists()
    # An empty or blank generated key in an existing log folder: refused at start, nothing changed.
    for content in ("", "  \n"):
        log_dir = tmp_path / "blank"
        log_dir.mkdir(exist_ok=True)
        (log_dir / "serve.key").write_text(content)
        line = one_error_line(_serve(serve_script, "--model", model, "--log", log_dir, "--port", 0))
        assert f"{log_dir / 'serve.key'}" in line and "is empty" in line, line
        assert sorted(p.name for p in log_dir.iterdir()) == ["serve.key"]
    # A world-readable token file: a warning line (no error line); the scheme is case-insensitive.
    token_file = tmp_path / "open.token"
    token_file.write_text("abcdefghijklmnop-0123456789\n")
    token_file.chmod(0o644)
    with Service(serve_script, model, tmp_path / "log", "--fsync", "never", "--token-file", token_file) as service:
        assert service.token == "abcdefghijklmnop-0123456789"
        for scheme in ("bearer", "BEARER", "Bearer"):
            status, text = service.post("/predict", {"x": [[0.0, 0.0, 0.0, 0.0]]},
                                        headers={"Authorization": f"{scheme} {service.token}"}, token=False)
            assert status == 200, (scheme, text)
        code, _, err = service.terminate()
    assert code == 0 and f"warning: token file {token_file} has mode rw-r--r--" in err and "error:" not in err, err


def test_options_are_range_checked_before_anything_is_created(serve_script, models, tmp_path):
    model = models["mlp_classifier.pt"]
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for args, expected in ((("--max-batch", 2147483647), "--max-batch must be in 1..1000000, got 2147483647"),
                           (("--queue-capacity", 2147483647), "--queue-capacity must be in 1..10000000, got 2147483647"),
                           (("--predictors", 100000), "--predictors must be in 1..256"),
                           (("--max-body-bytes", 1 << 40), "--max-body-bytes must be in 1..1073741824"),
                           (("--max-connections", 0), "--max-connections must be in 1..1000000, got 0"),
                           (("--host", "256.1.1.1"), "--host 256.1.1.1 is neither an IP address nor a host name")):
        log_dir = tmp_path / f"log{len(expected)}"
        result = _serve(serve_script, "--model", model, "--log", log_dir, "--port", 0, *args)
        line = one_error_line(result)
        assert expected in line and "null" not in line, result.stderr
        assert not log_dir.exists()
    line = one_error_line(_serve(serve_script, "--model", model, "--log", a_file, "--port", 0))
    assert line == f"--log {a_file} is a file, not a folder; name a folder (created when missing)", line


def test_starting_on_a_full_disk_is_one_line_naming_the_file_and_leaves_no_folder(serve_script, models, small_disk):
    model, log_dir = models["mlp_classifier.pt"], small_disk / "log"
    import os

    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)  # fill the tmpfs
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    result = _serve(serve_script, "--model", model, "--log", log_dir, "--port", 0)
    line = one_error_line(result)
    assert "No space left on device" in line and str(log_dir) in line, line
    assert not log_dir.exists()


def test_client_errors_and_jettys_own_refusals_are_one_line_4xx(serve_script, models, tmp_path):
    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never") as service:
        host, port = service.url.split("//")[1].split(":")

        def raw(request: bytes) -> str:
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(request)
                return s.recv(65536).decode(errors="replace")

        auth = f"Authorization: Bearer {service.token}\r\n".encode()
        answer = raw(b"POST /feedback HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\nZZ\r\nabc\r\n0\r\n\r\n")
        assert answer.startswith("HTTP/1.1 400") and answer.split("\r\n\r\n", 1)[1].startswith("error: "), answer
        for request in (b"GARBAGE\r\n\r\n", b"GET /predict HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"):
            answer = raw(request)
            status, body = answer.split("\r\n", 1)[0], answer.split("\r\n\r\n", 1)[1]
            assert status in ("HTTP/1.1 400 Bad Request", "HTTP/1.1 431 Request Header Fields Too Large"), answer
            assert body.startswith("error: ") and body.count("\n") == 1 and "<html" not in body, answer
        status, text = service.post("/feedback", b'{"x": [[0.1, 0.2, 0.3, 0.4]], "y": [1e1000000000]}')
        assert status == 400 and text.startswith("error: field 'y' must hold int64 integers"), text
        status, text = service.post("/feedback", b'{"x": [[0.1, 0.2, 0.3, 0.4]], "y": [1]}}')
        assert status == 400 and "setStrictness" not in text and "LENIENT" not in text and "https://" not in text, text
        status, text = service.post("/feedback", {"x": [[0.1, 0.2, 0.3, 0.4]], "y": [99]})
        assert status == 400 and "Target 99 is out of bounds" in text and "TorchScript interpreter" not in text, text
        acknowledged = _feed(service, 8, 12)
        assert service.terminate()[0] == 0
    _replay_bitwise(log_dir, model, acknowledged)


def test_a_jks_whose_key_password_differs_is_refused_in_one_line(serve_script, models, tmp_path):
    import shutil

    keytool = shutil.which("keytool")
    keystore, password_file = tmp_path / "server.jks", tmp_path / "tls.password"
    subprocess.run([keytool, "-genkeypair", "-alias", "serve", "-keyalg", "EC", "-groupname", "secp256r1", "-validity", "2",
                    "-dname", "CN=localhost", "-storetype", "JKS", "-keystore", str(keystore),
                    "-storepass", "store-pass-1", "-keypass", "other-key-pass"], check=True, capture_output=True, timeout=120)
    password_file.write_text("store-pass-1\n")
    log_dir = tmp_path / "log"
    result = _serve(serve_script, "--model", models["mlp_classifier.pt"], "--log", log_dir, "--port", 0,
                    "--tls-keystore", keystore, "--tls-password-file", password_file)
    line = one_error_line(result)
    assert f"keystore {keystore}: the key 'serve' has a password other than the keystore's" in line, line
    assert not log_dir.exists()


def test_the_duplicate_flag_is_each_requests_own(serve_script, models, tmp_path):
    """One client retries a key while others send new keys: a new request is never answered as a
    duplicate (the flag comes from the queue's answer to that request, not a shared counter)."""
    from concurrent.futures import ThreadPoolExecutor

    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never", "--threads", 16) as service:
        body = {"x": [[0.1, 0.2, 0.3, 0.4]], "y": [1]}
        assert not json.loads(service.post("/feedback", body, headers={"Idempotency-Key": "retried"})[1])["duplicate"]

        def retry(_):
            return json.loads(service.post("/feedback", body, headers={"Idempotency-Key": "retried"})[1])["duplicate"]

        def new(i):
            return json.loads(service.post("/feedback", body, headers={"Idempotency-Key": f"new-{i}"})[1])["duplicate"]

        with ThreadPoolExecutor(8) as pool:
            retries = pool.map(retry, range(150))
            news = pool.map(new, range(150))
            assert all(retries) and not any(news)
        assert service.terminate()[0] == 0
    _replay_bitwise(log_dir, model, 151)


def _two_input_model(path):
    import torch

    from gradbridge import export_training_module

    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.dense = torch.nn.Linear(2, 3)
            self.ids = torch.nn.Embedding(5, 3)

        def forward(self, left: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            return self.dense(left) + self.ids(ids)

    x = {"left": torch.zeros(4, 2), "ids": torch.zeros(4, dtype=torch.int64)}
    return export_training_module(TwoInputs(), "cross_entropy", "adam", path,
                                  example_inputs=(x, torch.zeros(4, dtype=torch.int64)))


def _two_input_data(n, seed):
    rng = np.random.default_rng(seed)
    left = rng.standard_normal((n, 2)).astype(np.float32)
    ids = rng.integers(0, 5, n)
    return {"left": left, "ids": ids}, ((left[:, 0] > 0).astype(np.int64) + (ids > 2).astype(np.int64))


def test_a_module_of_several_inputs_learns_by_name_and_bad_inputs_name_the_input(serve_script, tmp_path):
    """/feedback and /predict take {"x": {name: array, ...}} for a module of several inputs (a gate on
    an .npz of one array per input too); a missing, unknown or misshapen input is one line naming it;
    the log holds each event's inputs, the restart and the replay apply them bitwise."""
    import torch

    from gradbridge.reference import Reference

    model, log_dir = _two_input_model(tmp_path / "two.pt"), tmp_path / "log"
    gate_x, gate_y = _two_input_data(32, 30)
    gate = tmp_path / "gate.npz"
    np.savez(gate, y=gate_y, **gate_x)
    options = ("--fsync", "never", "--max-batch", 4, "--publish-every", 2, "--checkpoint-every", 3, "--gate-data", gate,
               "--gate-max-regression", 1)
    x, y = _two_input_data(40, 31)

    def rows(start, end):
        return {name: values[start:end].tolist() for name, values in x.items()}

    with Service(serve_script, model, log_dir, *options) as service:
        for start in range(0, 24, 4):
            status, body = service.post("/feedback", {"x": rows(start, start + 4), "y": y[start:start + 4].tolist()})
            assert status == 200, body
        left = x["left"][:2].tolist()
        for body, start in (({"x": {"left": left}, "y": [0, 1]}, "error: field 'x.ids' is missing (the model takes [left, ids])"),
                            ({"x": {"left": left, "ids": [0, 1], "extra": [1, 2]}, "y": [0, 1]},
                             "error: field 'x.extra': the model takes no such input (it takes [left, ids])"),
                            ({"x": {"left": [[0.1, 0.2, 0.3]], "ids": [1]}, "y": [0]},
                             "error: input x.left must be float32 of shape [-1, 2]"),
                            ({"x": {"left": left, "ids": [0.5, 1]}, "y": [0, 1]}, "error: field 'x.ids' must hold integers"),
                            ({"x": {"left": left, "ids": [0, 1, 2]}, "y": [0, 1]}, "error: x.left has 2 rows but x.ids has 3"),
                            ({"x": {"left": left, "ids": [0, 9]}, "y": [0, 1]}, "error: feedback rejected by the model's loss"),
                            ({"x": [[0.1, 0.2]], "y": [0]}, "error: field 'x' must be an object of the model's inputs by name")):
            status, text = service.post("/feedback", body)
            assert status == 400 and text.startswith(start) and text.count("\n") == 1, (body, status, text)
        status, text = service.post("/predict", {"x": {"left": left, "ids": [0, 7]}})  # ids: the model's range check
        assert status == 400 and text.startswith("error: x rejected by the model: ") and text.count("\n") == 1, text
        status, text = service.post("/predict", {"x": {"left": [[0.1, 2e6]], "ids": [0]}})
        assert status == 400 and "field 'x.left' element [0, 1] is 2000000.0" in text, text
        service.process.kill()
        service.process.wait(timeout=30)
    with Service(serve_script, model, log_dir, *options) as restarted:
        for start in range(24, 40, 4):
            assert restarted.post("/feedback", {"x": rows(start, start + 4), "y": y[start:start + 4].tolist()})[0] == 200
        status, body = restarted.post("/predict", {"x": rows(0, 3)})
        assert status == 200, body
        answer = json.loads(body)
        assert restarted.terminate()[0] == 0
    log = replay_mod.read_log(log_dir)
    assert [spec["name"] for spec in log.header["inputs"]] == ["left", "ids"] and len(log.events) == 40
    report = replay_mod.replay(log_dir, model, keep_parameters=True)
    assert report.bitwise and report.gate_losses_checked and report.events == 40, report.table()
    reference = Reference(model)
    with torch.no_grad():
        parameters = dict(reference.named_parameters())
        for name, value in report.parameters[answer["version"]].items():
            parameters[name].copy_(value)
        expected = reference.forward(reference.eval_model, {k: torch.from_numpy(v[:3]) for k, v in x.items()}).numpy()
    assert np.array_equal(np.array(answer["y"], dtype=np.float32), expected)


# ---- issue 37: publish gates, rollbacks, the input magnitude limit ----

def test_bad_gate_options_are_refused_at_start_in_one_line_and_leave_nothing(serve_script, models, tmp_path):
    from gradbridge import messages

    model = models["mlp_classifier.pt"]
    x, y = labelled(16, 4, seed=20)
    files = {}
    for name, arrays in (("good", {"x": x, "y": y}), ("narrow", {"x": x[:, :3], "y": y}), ("no_y", {"x": x}),
                         ("nan", {"x": np.where(np.arange(64).reshape(16, 4) == 5, np.nan, x).astype(np.float32), "y": y}),
                         ("labels", {"x": x, "y": np.full(16, 7, dtype=np.int64)})):
        files[name] = tmp_path / f"{name}.npz"
        np.savez(files[name], **arrays)
    files["text"] = tmp_path / "text.npz"
    files["text"].write_text("not a zip")
    missing = tmp_path / "missing.npz"
    cases = (
        (("--gate-data", missing), f"--gate-data {missing}: no such file"),
        (("--gate-data", files["narrow"]), messages.tensor_spec(str(files["narrow"]), "x", "float32", [-1, 4], "float32",
                                                                (16, 3))),
        (("--gate-data", files["no_y"]), messages.input_missing(str(files["no_y"]), "y", ["x"], ["x", "y"])),
        (("--gate-data", files["nan"]), f"{files['nan']}: x holds NaN or infinite values; clean the data first"),
        # the file and the array, the value and the classes (libtorch's "Target 7 is out of bounds" names none)
        (("--gate-data", files["labels"]), "--gate-data " + messages.value_out_of_range(str(files["labels"]), "y", None,
                                                                                        7, 0, 2)),
        (("--gate-data", files["text"]), f"{files['text']}: not a readable .npz file"),
        (("--gate-data", files["good"], "--gate-max-regression", "-0.1"),
         "--gate-max-regression must be a finite number >= 0, got -0.1"),
        (("--gate-data", files["good"], "--gate-max-regression", "NaN"),
         "--gate-max-regression must be a finite number >= 0, got NaN"),
        (("--gate-data", files["good"], "--gate-on-hold", "sometimes"),
         "unknown --gate-on-hold policy 'sometimes'; expected continue or rollback"),
        (("--gate-data", files["good"], "--keep-versions", 0), "--keep-versions must be in 1..10000, got 0"),
        (("--gate-max-regression", "0.1"), "--gate-max-regression needs --gate-data"),
        (("--keep-versions", 3), "--keep-versions needs --gate-data"),
        (("--max-input-abs", "-1"), "--max-input-abs must be a finite number >= 0 (0: no limit), got -1.0"),
    )
    for i, (args, expected) in enumerate(cases):
        log_dir = tmp_path / f"log{i}"
        result = _serve(serve_script, "--model", model, "--log", log_dir, "--port", 0, *args)
        line = one_error_line(result)
        assert expected in line, (args, result.stderr)
        assert not log_dir.exists(), args

    # A gated log resumes only with the same gate (it decides which versions were published).
    log_dir = tmp_path / "gated"
    with Service(serve_script, model, log_dir, "--fsync", "never", "--gate-data", files["good"],
                 "--gate-max-regression", "0.1") as service:
        acknowledged = _feed(service, 8, 21)
        assert service.terminate()[0] == 0
    before = {p.name: p.read_bytes() for p in log_dir.iterdir()}
    for args in (("--gate-data", files["good"], "--gate-max-regression", "0.2"), ()):
        line = one_error_line(_serve(serve_script, "--model", model, "--log", log_dir, "--port", 0, *args))
        assert "offset 0: it was written with publish gate" in line and "start another log folder" in line, line
    assert {p.name: p.read_bytes() for p in log_dir.iterdir()} == before
    with Service(serve_script, model, log_dir, "--fsync", "never", "--gate-data", files["good"],
                 "--gate-max-regression", "0.1") as same:  # resumes from the final checkpoint, its decision inside it
        assert json.loads(same.get("/healthz")[1])["held_versions"] == 0
        acknowledged += _feed(same, 8, 22)
        assert same.terminate()[0] == 0
    _replay_bitwise(log_dir, model, acknowledged)


def test_the_input_magnitude_limit_refuses_absurd_features_naming_the_element(serve_script, models, tmp_path):
    """--max-input-abs (default 1e6): feedback and predictions with a larger feature are refused with one
    line naming the field and the element; nothing is logged. Rollbacks need a gate: 409 without one."""
    from gradbridge import messages

    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never") as service:
        for path, body, index, value in (
                ("/feedback", {"x": [[0.1, 2e6, 0.3, 0.4]], "y": [1]}, [0, 1], 2e6),
                ("/feedback", {"x": [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, -3e7, 0.8]], "y": [1, 2]}, [1, 2], -3e7),
                ("/predict", {"x": [[1, 2, 3, 4e9]]}, [0, 3], 4e9)):
            status, text = service.post(path, body)
            expected = messages.input_too_large("x", index, float(np.float32(value)), 1e6)
            assert status == 400 and text == f"error: {expected}\n", (path, text)
        assert service.post("/feedback", {"x": [[1e6, -1e6, 0.5, 0.5]], "y": [0]})[0] == 200  # the limit itself is in
        assert service.post("/predict", {"x": [[1e6, -1e6, 0.5, 0.5]]})[0] == 200
        status, text = service.post("/admin/rollback", {})
        assert status == 409 and text.startswith("error: a rollback needs a publish gate (--gate-data)"), text
        assert service.terminate()[0] == 0
    assert sorted(replay_mod.read_log(log_dir).events) == [0]
    _replay_bitwise(log_dir, model, 1)


def _kafka_fed_log(serve_script, broker, model, log_dir, topic, records):
    kafka_broker.create_topic(broker, topic, partitions=1)
    kafka_broker.produce(broker, topic, records)
    with Service(serve_script, model, log_dir, "--max-batch", 8, *kafka_options(broker, topic)) as service:
        wait_for_records(log_dir, len(records))
        code, _, err = service.terminate()
        assert code == 0, err


def _renamed_source(log_dir, into, topic):
    """A copy of a Kafka-fed log whose reads name ``topic``: the same offsets, of another topic."""
    path = Path(log_dir) / replay_mod.FILE_NAME
    out = bytearray()
    for _, payload in replay_mod.frames(path, path.read_bytes()):
        if payload[:1] == b"S":
            (n,) = struct.unpack_from("<H", payload, 1)
            payload = payload[:1] + struct.pack("<H", len(topic.encode())) + topic.encode() + payload[3 + n:]
        out += replay_mod.frame(payload)
    into.mkdir()
    (into / replay_mod.FILE_NAME).write_bytes(bytes(out))


def test_replay_from_kafka_of_a_topic_that_is_not_the_logs_is_one_line(serve_script, broker, models, tmp_path):
    """replay --from-kafka against a topic holding other feedback under the same keys, a topic that ends before the
    log's offsets, a topic the log never read and a properties file that is missing: one line each, exit 1."""
    model = models["mlp_classifier.pt"]
    records = [(k, v) for k, v, _, _ in feedback_records(30, 5, "f")]
    log_dir = tmp_path / "log"
    _kafka_fed_log(serve_script, broker, model, log_dir, "faults-fed", records)
    bootstrap = kafka_broker.bootstrap(broker)

    def replay_from(log, topic, *more):
        return gradbridge_cli("replay", "--log", log, "--model", model, "--from-kafka", "--kafka-bootstrap", bootstrap,
                              "--kafka-topic", topic, *more)

    assert replay_from(log_dir, "faults-fed").returncode == 0  # the topic it read: bitwise
    other = [(key, value) for (key, _), (_, value, _, _) in zip(records, feedback_records(30, 6, "f"))]  # same keys
    kafka_broker.create_topic(broker, "faults-other", partitions=1)
    kafka_broker.produce(broker, "faults-other", other)
    _renamed_source(log_dir, tmp_path / "other", "faults-other")
    line = one_error_line(replay_from(tmp_path / "other", "faults-other"), "gradbridge: error: ")
    assert line == ("Kafka topic 'faults-other' partition 0 offset 0: sample 0 differs from the log's event 0: not the "
                    "records the log learned from"), line
    kafka_broker.create_topic(broker, "faults-short", partitions=1)
    kafka_broker.produce(broker, "faults-short", records[:3])
    _renamed_source(log_dir, tmp_path / "short", "faults-short")
    line = one_error_line(replay_from(tmp_path / "short", "faults-short"), "gradbridge: error: ")
    assert line == ("Kafka topic 'faults-short' partition 0 ends at offset 3 but the log read it up to offset 30 (not "
                    "the topic the log was fed from)"), line
    line = one_error_line(replay_from(log_dir, "faults-never"), "gradbridge: error: ")
    assert line == f"{log_dir / replay_mod.FILE_NAME} holds no read of Kafka topic 'faults-never' (it read 'faults-fed')"
    missing = tmp_path / "missing.properties"
    line = one_error_line(replay_from(log_dir, "faults-fed", "--kafka-properties", missing), "gradbridge: error: ")
    assert line == f"--kafka-properties {missing}: no such file", line  # as gradbridge serve says it


def test_replay_from_kafka_against_no_broker_fails_in_seconds_naming_the_address(serve_script, models, tmp_path):
    """replay --from-kafka with nothing listening at --kafka-bootstrap: one line naming the address within the
    bounded wait (5 s, or the properties file's default.api.timeout.ms), not the Kafka client's minute."""
    import time

    model, log_dir = models["mlp_classifier.pt"], tmp_path / "log"
    with Service(serve_script, model, log_dir, "--fsync", "never") as service:
        _feed(service, 8, 4)
        assert service.terminate()[0] == 0
    # a read of partition 0 of topic 'gone' (no records): what a Kafka-fed log holds, without a broker to write it
    name = b"gone"
    read = b"S" + struct.pack("<H", len(name)) + name + struct.pack("<Iiqq", 1, 0, 0, 0) + struct.pack("<Iq", 0, 0)
    with open(log_dir / replay_mod.FILE_NAME, "ab") as log:
        log.write(replay_mod.frame(read))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{probe.getsockname()[1]}"  # closed again: nothing listens there
    props = tmp_path / "client.properties"
    props.write_text("default.api.timeout.ms=1500\n")
    for more, wait in (((), 5000), (("--kafka-properties", props), 1500)):
        started = time.monotonic()
        result = gradbridge_cli("replay", "--log", log_dir, "--model", model, "--from-kafka", "--kafka-bootstrap",
                                bootstrap, "--kafka-topic", "gone", *more)
        elapsed = time.monotonic() - started
        line = one_error_line(result, "gradbridge: error: ")
        assert line == (f"no Kafka broker at {bootstrap} answered within {wait} ms (is it running and reachable from "
                        "here? default.api.timeout.ms in --kafka-properties sets the wait)"), line
        assert elapsed < 45, f"replay waited {elapsed:.0f} s"  # the JVM's start on a loaded machine, plus the wait


# ---- protocol 3 (format="export") behind the same service ----

def _export_protocol_3(model, path):
    import torch

    from gradbridge import export_training_module

    x, y = labelled(8, 4, seed=0)
    return export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters(), lr=1e-2), path,
                                  example_inputs=(torch.from_numpy(x), torch.from_numpy(y)), format="export")


def test_protocol_3_extreme_features_are_quarantined_undone_and_replayed_alike(serve_script, tmp_path):
    """The update guard on a protocol-3 module (micro-batches of one event: the graphs captured at one sample):
    the non-finite Adam update is undone and quarantined; `gradbridge replay` needs the user's model (one line
    without it) and agrees bit for bit with it; a restart resumes through the same decisions."""
    import torch

    from gradbridge import models

    torch.manual_seed(0)
    model = _export_protocol_3(models.mlp(), tmp_path / "m.pt")
    log_dir = tmp_path / "log"
    log = _post_extreme_feedback(serve_script, model, log_dir, [
        ([[0.1, 0.2, 0.3, 0.4]], [0]), ([[3e38, -3e38, 3e38, 3e38]], [1]), ([[0.5, 0.6, 0.7, 0.8]], [1])])
    assert [q.first_seq for q in log.quarantines] == [1] and log.quarantines[0].reason.startswith("the update makes ")
    line = one_error_line(gradbridge_cli("replay", "--log", log_dir, "--model", model), "gradbridge: error: ")
    assert line.endswith("holds no Python model: pass model= (your eager nn.Module; on the command line "
                         "--model-factory MODULE:FACTORY) to compare against"), line
    replayed = gradbridge_cli("replay", "--log", log_dir, "--model", model, "--model-factory",
                              "gradbridge.models:mlp")
    assert replayed.returncode == 0 and "bitwise identical" in replayed.stdout, replayed.stdout + replayed.stderr
    _restart_predicts_numbers(serve_script, model, log_dir)


def test_a_protocol_3_module_that_cannot_run_one_sample_is_refused_before_anything_is_written(serve_script, tmp_path):
    """BatchNorm in training refuses a batch of one sample (eager too): its export holds no graphs at one
    sample, and online learning (micro-batches of one event) is refused in one line."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = _export_protocol_3(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)), tmp_path / "m.pt")
    assert protocol.read_metadata(model)[protocol.PROGRAM_KEY]["min_batch"] == 2
    line = one_error_line(_serve(serve_script, "--model", model, "--log", tmp_path / "log", "--port", 0))
    assert line.endswith(f"{model}: this protocol-3 module runs batches of at least 2 (its export could not capture "
                         "one sample), but online learning runs batches of one; export with format='torchscript' "
                         "for it"), line
    assert not (tmp_path / "log").exists()
