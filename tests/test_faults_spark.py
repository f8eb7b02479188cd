"""Fault suite, surface "gradbridge-spark": bad input to the Spark trainer is one ``error:`` line
(exit code 1, no stack trace) before any step, and nothing is written. Modules of protocol 1 still
load and train single-process; the Spark trainer and the sharded replay refuse them with the same
line. (Task and executor failures mid-step are in ``test_spark.py``: they must not change the run.)
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from gradbridge import InvalidInputError, ProtocolError, messages, protocol, reference
from gradbridge._runtime import sparkrun
from gradbridge.export import export_builtin
from gradbridge.export import training_module
from tests.faults import one_error_line, rewrite_metadata, stray_files, train_cli
from tests.spark_cluster import gradle_properties

INPUTS = [protocol.tensor_spec("x", [-1, 4], "float32"), protocol.tensor_spec("y", [-1], "int64")]


class _ProtocolOne(training_module._TrainingModule):
    """The wrapper as it was before protocol 2: the two methods exist in Python but are not
    exported, so the scripted module lacks them (a subclass: TorchScript caches compiled classes)."""

    def gradient_flags(self):
        raise NotImplementedError

    def set_gradients(self, values, flags):
        raise NotImplementedError


class _BeforeSetState(training_module._TrainingModule):
    """The wrapper as it was before set_state: not exported (a subclass, as _ProtocolOne)."""

    def set_state(self, names, values):
        raise NotImplementedError


def _export_before_set_state(path):
    """A BatchNorm CNN exported as gradbridge wrote it before set_state existed."""
    original = training_module._TrainingModule
    training_module._TrainingModule = _BeforeSetState
    try:
        raw = export_builtin("small-cnn", path.with_name("raw_" + path.name), seed=0, side=8, channels=2, classes=3,
                             loss={"name": "cross_entropy"}, optimizer={"name": "sgd", "lr": 0.1},
                             inputs=[protocol.tensor_spec("x", [-1, 1, 8, 8], "float32"),
                                     protocol.tensor_spec("y", [-1], "int64")])
    finally:
        training_module._TrainingModule = original

    def without_set_state(document):
        document["methods"] = [m for m in document["methods"] if m != protocol.SET_STATE]
        return document

    return rewrite_metadata(raw, path, without_set_state)


def _export_protocol_one(path):
    """An export as gradbridge wrote it before protocol 2: no gradient_flags, no set_gradients."""
    original = training_module._TrainingModule
    training_module._TrainingModule = _ProtocolOne
    try:
        raw = export_builtin("mlp", path.with_name("raw_" + path.name), seed=0, in_features=4, hidden=(8,),
                             out_features=3, loss={"name": "cross_entropy"}, optimizer={"name": "sgd", "lr": 0.1},
                             inputs=INPUTS, fine_tuning={"check": False})  # the check needs gradient_flags
    finally:
        training_module._TrainingModule = original

    def as_version_one(document):
        document["protocol_version"] = 1
        document["methods"] = [m for m in document["methods"] if m not in protocol.DATA_PARALLEL_METHODS]
        return document

    return rewrite_metadata(raw, path, as_version_one)


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(2, 3)
        self.b = torch.nn.Linear(2, 3)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        return self.a(left) + self.b(right)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spark-faults")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 4)).astype(np.float32)
    y = rng.integers(0, 3, 40).astype(np.int64)
    np.savez(folder / "data.npz", x=x, y=y)
    np.savez(folder / "three_rows.npz", x=x[:3], y=y[:3])
    np.savez(folder / "x64.npz", x=x.astype(np.float64), y=y)
    np.savez(folder / "x3.npz", x=x[:, :3].copy(), y=y)
    # a module of two named inputs, and Parquet without one of them, or with a column it does not take
    two = training_module.export_training_module(
        _TwoInputs(), "cross_entropy", "sgd", folder / "two.pt",
        example_inputs=({"left": torch.zeros(4, 2), "right": torch.zeros(4, 2)}, torch.zeros(4, dtype=torch.int64)))
    left, right = x[:, :2].copy(), x[:, 2:].copy()
    np.savez(folder / "two_missing.npz", left=left, y=y)
    np.savez(folder / "two_unknown.npz", left=left, right=right, extra=right, y=y)
    # a label past the 3 classes; an item id past a recommender's 4 items (embedding rows)
    labels = y.copy()
    labels[23] = 7
    np.savez(folder / "labels.npz", x=x, y=labels)
    from gradbridge.recommender import export as export_recommender

    recommender = export_recommender(folder / "recommender.pt", users=5, items=4, dim=2, lr=0.05)
    ids = np.stack([rng.integers(0, 5, 40), rng.integers(0, 4, 40)], 1).astype(np.int64)
    ids[31, 1] = 9
    np.savez(folder / "ids.npz", x=ids, y=rng.standard_normal((40, 1)).astype(np.float32))
    sparkrun.to_parquet([(folder / f"{name}.npz", folder / f"{name}.parquet")
                         for name in ("x64", "x3", "two_missing", "two_unknown", "ids")])
    old_cnn = _export_before_set_state(folder / "old_cnn.pt")
    good = export_builtin("mlp", folder / "mlp.pt", seed=0, in_features=4, hidden=(8,), out_features=3,
                          loss={"name": "cross_entropy"}, optimizer={"name": "sgd", "lr": 0.1}, inputs=INPUTS)
    cnn = export_builtin("small-cnn", folder / "cnn.pt", seed=0, side=8, channels=2, classes=3,
                         loss={"name": "cross_entropy"}, optimizer={"name": "sgd", "lr": 0.1},
                         inputs=[protocol.tensor_spec("x", [-1, 1, 8, 8], "float32"),
                                 protocol.tensor_spec("y", [-1], "int64")])
    return {"folder": folder, "x": x, "y": y, "good": good, "cnn": cnn, "old_cnn": old_cnn, "two": two,
            "recommender": recommender, "v1": _export_protocol_one(folder / "protocol1.pt")}


def refused(files, tmp_path, *args, master="local[2]") -> str:
    """Run the trainer with a history and checkpoint asked for; its one error line; nothing written."""
    result = sparkrun.run(["--master", master, "--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt",
                           *map(str, args)], check=False)
    line = one_error_line(result)
    assert stray_files(tmp_path) == []
    return line


def test_protocol_one_module_still_loads_and_trains_single_process(files, tmp_path):
    assert protocol.read_metadata(files["v1"])["protocol_version"] == 1
    result = train_cli("--model", files["v1"], "--data", files["folder"] / "data.npz", "--epochs", "1",
                       "--history", tmp_path / "h.jsonl")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "h.jsonl").exists()


def test_protocol_one_module_is_refused_by_spark_and_the_replay(files, tmp_path):
    expected = messages.data_parallel_methods(str(files["v1"]), 1, list(protocol.DATA_PARALLEL_METHODS))
    assert refused(files, tmp_path, "--model", files["v1"], "--data", files["folder"] / "data.npz") == expected
    with pytest.raises(ProtocolError) as error:
        reference.train_sharded(files["v1"], files["x"], files["y"], epochs=1, shards=2)
    assert str(error.value) == expected


def test_module_writing_buffers_without_set_state_is_refused_by_spark_and_the_replay(files, tmp_path):
    """BatchNorm statistics train on Spark (test_spark_models.py); a module exported before set_state
    cannot receive the first partition's, so it is refused before any step, in one line naming them."""
    assert protocol.SET_STATE in protocol.read_metadata(files["cnn"])["methods"]  # this version's export trains
    buffers = [b["name"] for b in protocol.read_metadata(files["old_cnn"])["buffers"] if b.get("trained", True)]
    assert len(buffers) == 6  # two BatchNorms' statistics
    expected = messages.data_parallel_buffers(str(files["old_cnn"]), buffers)
    assert refused(files, tmp_path, "--model", files["old_cnn"], "--data", files["folder"] / "data.npz") == expected
    with pytest.raises(ProtocolError) as error:
        reference.train_sharded(files["old_cnn"], files["x"], files["y"], epochs=1, shards=2)
    assert str(error.value) == expected


def test_the_replay_refuses_a_thread_count_out_of_range(files):
    for bad in (0, 4097, 1.5):
        with pytest.raises(InvalidInputError) as error:
            reference.train_sharded(files["good"], files["x"], files["y"], epochs=1, shards=2, threads=bad)
        assert str(error.value) == messages.argument("threads", "an integer in 1..4096", bad)


def test_an_input_column_missing(files, tmp_path):
    """A module of several inputs (left, right) on Parquet without the column of one: the line names it."""
    data = files["folder"] / "two_missing.parquet"
    line = refused(files, tmp_path, "--model", files["two"], "--data", data)
    assert line == (f"{data}: no column right; expected a column right of array<float> (float32 of shape [-1, 2] "
                    "in the model's metadata), found columns [left, y]")


def test_a_column_the_model_does_not_take(files, tmp_path):
    """A module of several inputs takes exactly its inputs' columns and y: a feature column it does not take
    is refused, naming it (InputMessages.unknownColumn), rather than dropped without a word."""
    data = files["folder"] / "two_unknown.parquet"
    line = refused(files, tmp_path, "--model", files["two"], "--data", data)
    assert line == (f"{data}: column extra is not an input of the model (it takes [left, right] and y); a model of "
                    "several inputs trains on exactly its inputs' columns and y: drop the others")


def test_an_npz_without_an_input_is_the_trainers_line(files, tmp_path):
    data = files["folder"] / "two_missing.npz"
    line = refused(files, tmp_path, "--model", files["two"], "--data", data)
    assert line == messages.input_missing(str(data), "right", ["left", "y"], ["left", "right", "y"])


def test_an_npz_array_the_model_does_not_take_is_the_trainers_line(files, tmp_path):
    """The .npz twin of the unknown Parquet column: refused in the single-process Trainer's line."""
    data = files["folder"] / "two_unknown.npz"
    line = refused(files, tmp_path, "--model", files["two"], "--data", data)
    assert line == messages.unknown_array(str(data), "extra", ["left", "right"])


@pytest.mark.parametrize("model, data, array, element, value, high", [
    ("good", "labels.npz", "y", None, 7, 2),
    ("recommender", "ids.parquet", "x", [1], 9, 3)])
def test_a_label_or_id_the_model_does_not_take_is_one_line_before_the_stage(files, tmp_path, model, data, array,
                                                                           element, value, high):
    """Was the barrier stage failing at every retry, 1,000-1,500 lines of executor errors and traces and no
    error line: the driver asks the model about each column's extremes first (ValueRanges), so the one line
    names the data, the column, the value and the range the model takes, and is all there is on stderr. The
    Python replay says the same of the arrays."""
    path = files["folder"] / data
    result = sparkrun.run(["--master", "local[2]", "--model", files[model], "--data", path,
                           "--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt"], check=False)
    expected = messages.value_out_of_range(str(path), array, element, value, 0, high)
    assert one_error_line(result) == expected
    assert result.stderr.strip().splitlines() == [f"error: {expected}"]
    assert stray_files(tmp_path) == []
    arrays = np.load(files["folder"] / data.replace(".parquet", ".npz"))
    with pytest.raises(InvalidInputError) as error:
        reference.train_sharded(files[model], arrays["x"], arrays["y"], epochs=1, shards=2)
    assert str(error.value) == messages.value_out_of_range("training data", array, element, value, 0, high)


def test_parquet_column_of_the_wrong_dtype(files, tmp_path):
    line = refused(files, tmp_path, "--model", files["good"], "--data", files["folder"] / "x64.parquet")
    assert line == (f"{files['folder'] / 'x64.parquet'}: column x must be array<float> (float32 of shape [-1, 4] "
                    "in the model's metadata), got array<double>")


def test_parquet_rows_of_the_wrong_shape(files, tmp_path):
    line = refused(files, tmp_path, "--model", files["good"], "--data", files["folder"] / "x3.parquet")
    assert line == (f"{files['folder'] / 'x3.parquet'}: column x rows must hold 4 values (float32 of shape [-1, 4] "
                    "in the model's metadata), found rows of 3 values")


def test_empty_partition(files, tmp_path):
    data = files["folder"] / "three_rows.npz"
    line = refused(files, tmp_path, "--model", files["good"], "--data", data, "--partitions", "4")
    assert line == f"{data}: 3 rows cannot fill 4 partitions (partition 3 would be empty); use at most 3 partitions"


def test_a_newer_protocol_version_is_refused_by_both_languages(files, tmp_path):
    future = rewrite_metadata(files["good"], files["folder"] / "protocol4.pt",
                              lambda document: {**document, "protocol_version": 4})
    with pytest.raises(ProtocolError, match=r"protocol version 4, this gradbridge reads 1, 2 and 3$"):
        protocol.read_metadata(future)
    line = refused(files, tmp_path, "--model", future, "--data", files["folder"] / "data.npz")
    assert line == (f"{future}: protocol version 4, this gradbridge reads versions [1, 2, 3]. "
                    "Re-export the module with a matching gradbridge.")


@pytest.mark.parametrize("setting, value, line", [
    ("spark.gradbridge.exchange", "ring", "spark.gradbridge.exchange must be gloo or relay, got ring"),
    *[("spark.gradbridge.exchange.oneRoundBytes", value,
       f"spark.gradbridge.exchange.oneRoundBytes must be a whole number of bytes in 0..536870912, got {value}")
      for value in ("-1", "256k", "536870913")],
    *[("spark.gradbridge.threads", value,
       f"spark.gradbridge.threads must be a whole number of threads in 1..4096, got {value}")
      for value in ("0", "two", "4097")]])
def test_a_bad_spark_gradbridge_setting(files, tmp_path, setting, value, line):
    result = sparkrun.run(["--master", "local[2]", "--model", files["good"], "--data", files["folder"] / "data.npz",
                           "--history", tmp_path / "h.jsonl", "--checkpoint", tmp_path / "c.pt"],
                          check=False, jvm_options=[f"-D{setting}={value}"])
    assert one_error_line(result) == line
    assert stray_files(tmp_path) == []


def test_bad_exchange_settings_are_refused_before_spark_starts(files, tmp_path):
    """With a bad driver port too (which only the starting context reads): the exchange's line comes,
    so the setting was checked before Spark started."""
    result = sparkrun.run(["--master", "local[2]", "--model", files["good"], "--data", files["folder"] / "data.npz",
                           "--history", tmp_path / "h.jsonl"], check=False,
                          jvm_options=["-Dspark.gradbridge.exchange=ring", "-Dspark.driver.port=abc"])
    assert one_error_line(result) == "spark.gradbridge.exchange must be gloo or relay, got ring"
    assert result.stderr.strip().splitlines() == ["error: spark.gradbridge.exchange must be gloo or relay, got ring"]
    assert stray_files(tmp_path) == []


@pytest.mark.parametrize("master", ["bogus://x", "local[0]", "local[x]", "locals"])
def test_a_master_spark_cannot_run_on_is_one_line(files, tmp_path, master):
    """Refused before Spark starts: no Spark ERROR line, no stack trace, the error line alone."""
    result = sparkrun.run(["--master", master, "--model", files["good"], "--data", files["folder"] / "data.npz",
                           "--history", tmp_path / "h.jsonl"], check=False)
    line = one_error_line(result)
    assert line.startswith(f"--master {master}: not a Spark master URL; expected local, local[K]"), line
    assert result.stderr.strip().splitlines() == [f"error: {line}"]
    assert stray_files(tmp_path) == []


@pytest.mark.parametrize("setting, host, reason", [
    ("spark.driver.host", "203.0.113.7", "not an address of this machine"),  # TEST-NET-3: never this machine's
    ("spark.driver.bindAddress", "no-such-host.invalid", "no such host")])
def test_a_driver_address_that_is_not_this_machines_is_one_line(files, tmp_path, setting, host, reason):
    """Spark would try 16 ports there (a warning each) and fail with its stack trace: the line comes alone."""
    result = sparkrun.run(["--master", "local[2]", "--model", files["good"], "--data", files["folder"] / "data.npz",
                           "--history", tmp_path / "h.jsonl"], check=False, jvm_options=[f"-D{setting}={host}"])
    line = one_error_line(result)
    assert line == messages_driver_address(setting, host, reason)
    assert result.stderr.strip().splitlines() == [f"error: {line}"]
    assert stray_files(tmp_path) == []


def messages_driver_address(setting: str, host: str, reason: str) -> str:
    """ShardedMessages.sparkDriverAddress (Java only: the Python side starts no Spark)."""
    return f"{setting} {host}: the driver cannot listen there ({reason}); name an address of this machine, or leave it unset"


def test_a_spark_start_failure_is_one_line(files, tmp_path):
    """A setting only Spark reads, refused as its context starts: Spark's reason in one line, no ERROR line or trace."""
    result = sparkrun.run(["--master", "local[2]", "--model", files["good"], "--data", files["folder"] / "data.npz",
                           "--history", tmp_path / "h.jsonl"], check=False, jvm_options=["-Dspark.driver.port=abc"])
    assert one_error_line(result) == "Spark could not start: spark.driver.port should be int, but was abc"
    assert "ERROR" not in result.stderr
    assert stray_files(tmp_path) == []


def _listening(pid: int) -> list:
    """The TCP sockets process ``pid`` listens on, as (address, port), from /proc (IPv4-mapped IPv6 as IPv4)."""
    try:
        return _listening_now(pid)
    except OSError:  # it ended (or became a zombie, which has no fds or net tables) between poll() and here
        return []


def _listening_now(pid: int) -> list:
    import ipaddress
    import os
    import re

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue  # closed meanwhile
        if match:
            inodes.add(match.group(1))
    found = []
    for table, width in (("tcp", 4), ("tcp6", 16)):
        for row in open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw, port = fields[1].split(":")
            # /proc prints each 32-bit word in host (little-endian) order
            words = [bytes.fromhex(raw[i:i + 8])[::-1] for i in range(0, len(raw), 8)]
            address = ipaddress.ip_address(b"".join(words)) if width == 16 else ipaddress.ip_address(words[0])
            if getattr(address, "ipv4_mapped", None):
                address = address.ipv4_mapped
            found.append((str(address), int(port, 16)))
    return found


def test_a_local_run_listens_on_loopback_only_and_its_store_refuses_a_client_without_the_secret(files, tmp_path):
    """While a local[2] Gloo run trains, every socket its JVM listens on is bound to 127.0.0.1 (never the
    wildcard, never the external address), and a c10d client (torch's TCPStore) or raw bytes sent to
    each of them get no store: refused. The run is not disturbed: bitwise the replay."""
    import socket
    import subprocess
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from tests.spark_support import assert_bitwise
    from gradbridge.history import History

    rng = np.random.default_rng(7)
    x = rng.standard_normal((600, 4)).astype(np.float32)
    y = rng.integers(0, 3, 600).astype(np.int64)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    history = tmp_path / "h.jsonl"
    process = subprocess.Popen(sparkrun.command(["--master", "local[2]", "--model", files["good"], "--data",
                                                 tmp_path / "data.npz", "--epochs", "3", "--batch-size", "4",
                                                 "--history", history]),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, answered = set(), []
    try:
        while process.poll() is None:
            for address, port in _listening(process.pid):
                if (address, port) in seen:
                    continue
                seen.add((address, port))
                try:
                    store = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=2),
                                          wait_for_workers=False)
                    store.set("gradbridge/intruder", b"1")
                    answered.append((address, port))
                except Exception:
                    pass  # refused: no store answers there
                try:
                    with socket.create_connection((address, port), timeout=2) as raw:
                        raw.sendall(b"\x00" * 64 + bytes(range(256)))
                except OSError:
                    pass
            time.sleep(0.2)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err[-3000:]
    assert seen, "the run's sockets were not seen"
    assert {address for address, _ in seen} == {"127.0.0.1"}, seen
    assert answered == []
    replay = reference.train_sharded(files["good"], x, y, epochs=3, shards=2, batch_size=4)
    assert_bitwise(History.load(history), replay)


def test_the_artifact_of_another_spark_line_is_refused(files, tmp_path):
    """gradbridge-spark_2.12 (built for Spark 3.5.x) on Spark 4.0 (Scala 2.13): one line naming the artifact to
    take, before Spark starts (else the first Scala call fails in a task, with a stack trace per attempt)."""
    command = sparkrun.command(["--master", "local[1]", "--model", files["good"], "--data",
                                files["folder"] / "data.npz", "--history", tmp_path / "h.jsonl"])
    at = command.index("-cp") + 1
    entries = command[at].split(os.pathsep)
    other = [re.sub(r"gradbridge-spark_2\.13-(?=[^/]*\.jar$)", "gradbridge-spark_2.12-", e) for e in entries]
    assert other != entries and all(Path(e).exists() for e in other)
    command[at] = os.pathsep.join(other)
    scala = next(re.search(r"scala-library-(2\.13\.\d+)\.jar$", e).group(1) for e in entries
                 if re.search(r"scala-library-2\.13\.\d+\.jar$", e))
    line = one_error_line(subprocess.run(command, capture_output=True, text=True, check=False, timeout=300))
    assert line == (f"gradbridge-spark_2.12 is built for Spark 3.5.x (Scala 2.12), this is Spark "
                    f"{gradle_properties()['sparkVersion']} on Scala {scala}; use gradbridge-spark_2.12 (spark-submit: "
                    "gradbridge-spark-submit_2.12) for Spark 3.5.x on Scala 2.12, gradbridge-spark_2.13 "
                    "(gradbridge-spark-submit_2.13) for Spark 4.0 to 4.3")
    assert stray_files(tmp_path) == []


def test_an_empty_data_folder_is_one_line(files, tmp_path):
    """Spark cannot infer a schema from no files (its AnalysisException is a checked exception in Java's eyes)."""
    empty = files["folder"] / "empty-folder"
    empty.mkdir(exist_ok=True)
    line = refused(files, tmp_path, "--model", files["good"], "--data", empty)
    assert line.startswith(f"{empty}: not a Parquet dataset: ") and "Unable to infer schema" in line, line


def test_an_edited_checkpoint_without_what_a_resume_needs_is_refused(files, tmp_path, tmp_path_factory):
    """--resume of a file without its checkpoint entry (it would start over), or of an entry without the
    data's digest (the same-data check would be skipped): one line naming the file and what it lacks,
    before Spark starts. A data-parallel checkpoint names its data by shards_sha256 (older ones: data_sha256)."""
    work = tmp_path_factory.mktemp("resume")
    trained = train_cli("--model", files["good"], "--data", files["folder"] / "data.npz", "--epochs", 1,
                        "--checkpoint", work / "c.pt")
    assert trained.returncode == 0, trained.stderr
    line = refused(files, tmp_path, "--resume", files["good"], "--data", files["folder"] / "data.npz")
    assert line.startswith(f'{files["good"]}: not a checkpoint to resume: its gradbridge.json has no "checkpoint" '
                           "entry"), line

    def without_digest(document):
        del document["checkpoint"]["data_sha256"]
        return document

    crafted = rewrite_metadata(work / "c.pt", work / "crafted.pt", without_digest)
    line = refused(files, tmp_path, "--resume", crafted, "--data", files["folder"] / "data.npz")
    assert line.startswith(f'{crafted}: its "checkpoint" entry has no "shards_sha256" key, which a resume needs to '
                           "check that it continues on the data the run was trained on"), line
