"""gradbridge-spark: synchronous data-parallel training on an embedded Spark (local[K]) in a JVM of
its own, against its Python replay (``reference.train_sharded``), bit for bit.

The Java side runs ``SparkTrainCommand`` through ``gradbridge._runtime.sparkrun`` (``java`` with Spark's
Java 17 flags, on this Python's libtorch). Default run: K=2 SGD shuffled with a task fault, its
resume on Parquet with an executor-loss fault, K=2 SGD and Adam in order, K=3 over each exchange
(Gloo, the default, and the driver relay), K=1 Adam equal to
single-process training, the tasks' libtorch threads (the task's cores by default, or
spark.gradbridge.threads) each against the replay at that count; models of several inputs (a column per input): a scripted recommender K=2 on
Parquet with an executor-loss fault and its resume on .npz, a traced model with an attention mask K=1
equal to the user's eager model. ``--full`` adds K=4 and the rest of {SGD, Adam} x {shuffled, in order} x K in {1, 2, 4}.
Bad input is in ``test_faults_spark.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct

import numpy as np
import pytest
import torch

from gradbridge import export_training_module, messages, protocol, reference, spark_history
from gradbridge._runtime import sparkrun
from gradbridge.commands.main import main as cli_main
from gradbridge.errors import CLI_ERROR_PREFIX, InvalidInputError
from gradbridge.export import export_builtin
from gradbridge.history import History
from tests.faults import gradbridge_cli
from tests.spark_support import assert_bitwise, data_case, recommender_case, spark_train

EPOCHS = 2
BATCH = 32

# (optimizer, K, shuffle): the default run has SGD K=2 in order here and one case of each other kind
# in the tests below; --full runs all twelve.
FULL_MATRIX = [(opt, k, shuffle) for opt in ("sgd", "adam") for k in (1, 2, 4) for shuffle in (True, False)]


def pytest_generate_tests(metafunc):
    if "matrix_case" in metafunc.fixturenames:
        cases = FULL_MATRIX if metafunc.config.getoption("--full") else [("sgd", 2, False)]
        metafunc.parametrize("matrix_case", cases, ids=[f"{o}-K{k}-{'shuffle' if s else 'ordered'}"
                                                        for o, k, s in cases])


OPTIMIZERS = {"sgd": {"name": "sgd", "lr": 0.1}, "adam": {"name": "adam", "lr": 0.01}}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Models (MLP 4 -> 16 -> 3, cross-entropy; SGD and Adam), data as .npz and as Parquet."""
    folder = tmp_path_factory.mktemp("spark")
    inputs = [protocol.tensor_spec("x", [-1, 4], "float32"), protocol.tensor_spec("y", [-1], "int64")]
    models = {name: export_builtin("mlp", folder / f"mlp_{name}.pt", seed=0, in_features=4, hidden=(16,),
                                   out_features=3, loss={"name": "cross_entropy"}, optimizer=spec, inputs=inputs)
              for name, spec in OPTIMIZERS.items()}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4)).astype(np.float32)
    y = rng.integers(0, 3, 200).astype(np.int64)
    np.savez(folder / "data.npz", x=x, y=y)
    np.savez(folder / "x64.npz", x=x.astype(np.float64), y=y)
    np.savez(folder / "x3.npz", x=x[:, :3].copy(), y=y)
    sparkrun.to_parquet([(folder / "data.npz", folder / "data.parquet"), (folder / "x64.npz", folder / "x64.parquet"),
                         (folder / "x3.npz", folder / "x3.parquet")])
    return {"folder": folder, "models": models, "x": x, "y": y, "npz": folder / "data.npz",
            "parquet": folder / "data.parquet"}


def test_sgd_k2_shuffled_with_a_failed_task_equals_the_replay(work, tmp_path):
    """A task failing mid-epoch (after its gradients of step 2, first stage attempt) fails the
    barrier stage; Spark retries the stage from the state the driver holds; the run is still the
    replay's bit for bit. Its checkpoint is the next test's start."""
    history = tmp_path / "h.jsonl"
    checkpoint = work["folder"] / "sgd_k2_epoch1.pt"
    result, stats = spark_train("--model", work["models"]["sgd"], "--data", work["npz"], "--epochs", 1,
                                "--batch-size", BATCH, "--history", history, "--checkpoint", checkpoint,
                                "--inject-fault", "task@0:2:1", master="local[2,2]")
    replay = reference.train_sharded(work["models"]["sgd"], work["x"], work["y"], epochs=1, shards=2,
                                     batch_size=BATCH)
    assert_bitwise(History.load(history), replay)
    assert stats["stages_retried"] >= 1 and stats["failed_tasks"] >= 1, stats
    assert stats["partitions"] == 2 and stats["steps"] == 7
    assert stats["module_loads"] == 2, stats  # one replica per task of the stage that succeeded
    assert "barrier stage(s) retried" in result.stdout
    # the checkpoint names its data by the partitions' digest, not data_sha256 (which is SHA-256(x||y))
    saved = protocol.read_metadata(checkpoint)["checkpoint"]
    assert "data_sha256" not in saved or saved["data_sha256"] is None
    assert saved["shards_sha256"] == reference.shards_sha256(work["x"], work["y"], 2)


def test_resume_on_parquet_after_an_executor_loss_equals_the_replay(work, tmp_path):
    """The checkpoint of the first epoch, resumed on the same rows as Parquet (same fingerprint),
    with a task failing mid-epoch after its JVM dropped its cached partitions (as a lost executor):
    the retried stage rebuilds them, and the two epochs equal a two-epoch replay."""
    checkpoint = work["folder"] / "sgd_k2_epoch1.pt"
    if not checkpoint.exists():
        pytest.fail("the previous test writes the checkpoint this test resumes")
    history = tmp_path / "h.jsonl"
    _, stats = spark_train("--resume", checkpoint, "--data", work["parquet"], "--epochs", 1, "--history", history,
                           "--inject-fault", "executor@1:3:0", master="local[2,2]")
    replay = reference.train_sharded(work["models"]["sgd"], work["x"], work["y"], epochs=2, shards=2,
                                     batch_size=BATCH)
    resumed = History.load(history)
    assert [r.epoch for r in resumed] == [1]
    assert_bitwise(resumed, [replay[1]])
    # the retry may fail once more while Spark still lists the dropped blocks on this JVM
    assert stats["stages_retried"] >= 1 and stats["failed_tasks"] >= 1, stats


def _gloo_header(parameters) -> int:
    """A Gloo record's header: rows (int), loss (double), one flag per parameter, padded to 8 bytes."""
    return -(-(4 + 8 + len(parameters)) // 8) * 8


def gloo_bytes_per_step(parameters, k: int) -> int:
    """What the busiest task sends per step over Gloo (GlooExchange): to each other owner c a record
    (the header, chunk c of the float32 gradient: ceil(E/K) elements, the last chunk the rest), then
    (K-1) padded chunks around the all-gather's ring."""
    total = sum(int(np.prod(p.shape)) for p in parameters)
    each = -(-total // k)
    chunk = [4 * (min(total, each * (c + 1)) - min(total, each * c)) for c in range(k)]
    record = [_gloo_header(parameters) + b for b in chunk]
    return max(sum(record) - record[me] + (k - 1) * max(chunk) for me in range(k))


def gloo_one_round_bytes_per_step(parameters, k: int) -> int:
    """What a task sends per step over Gloo in one round ((K-1) times the gradient at most oneRoundBytes):
    its whole record (the header, the float32 gradient) to the (K-1) others."""
    total = sum(int(np.prod(p.shape)) for p in parameters)
    return (k - 1) * (_gloo_header(parameters) + 4 * total)


def test_adam_k2_in_order_equals_the_replay(work, tmp_path):
    """By chunk (oneRoundBytes 0: this small model would go in one round): the reduce-scatter's bytes."""
    history = tmp_path / "h.jsonl"
    _, stats = spark_train("--model", work["models"]["adam"], "--data", work["npz"], "--epochs", EPOCHS, "--no-shuffle",
                "--history", history, master="local[2]", one_round_bytes=0)
    replay = reference.train_sharded(work["models"]["adam"], work["x"], work["y"], epochs=EPOCHS, shards=2,
                                     batch_size=BATCH, shuffle=False)
    assert_bitwise(History.load(history), replay)
    assert stats["exchange"] == "gloo all-to-all + all-gather", stats
    assert stats["module_loads"] == 2, stats  # one stage for the run: each task loads its replica once
    parameters = list(torch.jit.load(str(work["models"]["adam"])).parameters())
    assert stats["bytes_sent"] == stats["steps"] * gloo_bytes_per_step(parameters, 2), stats
    assert stats["bytes_sent"] < stats["steps"] * 2 * stats["parameter_bytes"], stats


@pytest.fixture(scope="module")
def thread_runs(tmp_path_factory):
    """A wider MLP (8 -> 16 -> 64, MSE; ~1024 x 64 values a task, above libtorch's 32768-value grain, so with
    two threads its kernels split their work) trained K=2 for one epoch on local[2], twice: with
    spark.gradbridge.threads unset (the task's cores, 1) and set to 2. The runs' histories by thread count."""
    folder = tmp_path_factory.mktemp("spark-threads")
    inputs = [protocol.tensor_spec("x", [-1, 8], "float32"), protocol.tensor_spec("y", [-1, 64], "float32")]
    model = export_builtin("mlp", folder / "wide.pt", seed=0, in_features=8, hidden=(16,), out_features=64,
                           loss={"name": "mse"}, optimizer={"name": "sgd", "lr": 0.01}, inputs=inputs)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4096, 8)).astype(np.float32)
    y = rng.standard_normal((4096, 64)).astype(np.float32)
    np.savez(folder / "wide.npz", x=x, y=y)
    histories, stats = {}, {}
    for setting, count in ((None, 1), (2, 2)):
        histories[count] = folder / f"h{count}.jsonl"
        _, stats[count] = spark_train("--model", model, "--data", folder / "wide.npz", "--epochs", 1,
                                      "--batch-size", 2048, "--history", histories[count], master="local[2]",
                                      threads=setting)
    return {"folder": folder, "model": model, "x": x, "y": y, "npz": folder / "wide.npz", "histories": histories,
            "stats": stats}


def test_each_task_runs_on_its_share_of_threads_and_equals_the_replay_at_that_count(thread_runs):
    """Unset, spark.gradbridge.threads is the task's cores (spark.task.cpus, 1): local[2]'s two tasks
    run one libtorch thread each, not each as many as the machine has cores; set, every task runs that
    many (each task reads its count back from libtorch on its own thread). A few kernels' bits depend on
    the count (a sum split by thread), so each run is compared with the replay at its tasks' count, bit for
    bit: the history records the count and the run's settings, the replay runs on 1 (Spark's defaults) by
    itself, on another when told, and on the run's own given its history; it leaves this process's count as it was."""
    case = thread_runs
    previous = torch.get_num_threads()
    for count, path in case["histories"].items():
        assert case["stats"][count]["threads"] == [count, count], case["stats"][count]
        java = History.load(path)
        assert [r.threads for r in java] == [count]  # the history records it for the replay
        assert java[0].sharded.to_json() == {"partitions": 2, "batch_size": 2048, "seed": 0, "shuffle": True,
                                             "rule": protocol.SHARDED_RULE,
                                             "shards_sha256": reference.shards_sha256(case["x"], case["y"], 2)}
        threads = None if count == 1 else java[0].threads  # the replay's default is the tasks' default
        assert_bitwise(java, reference.train_sharded(case["model"], case["x"], case["y"], epochs=1, shards=2,
                                                     batch_size=2048, threads=threads))
        assert torch.get_num_threads() == previous  # the caller's count, restored
    said = []
    replay = reference.train_sharded(case["model"], case["x"], case["y"], run=case["histories"][2], say=said.append)
    assert_bitwise(History.load(case["histories"][2]), replay)
    assert said == [messages.replay_threads(2, previous, messages.THREADS_RECORDED.format(case["histories"][2]))]


def _edited(source, target, edit) -> None:
    """``source``'s lines, each JSON object passed through ``edit``, written to ``target`` (keys kept in order)."""
    lines = [json.loads(line) for line in source.read_text().splitlines()]
    target.write_text("".join(json.dumps(edit(line)) + "\n" for line in lines))


def _last_bit_flipped(value: float) -> float:
    (bits,) = struct.unpack("<q", struct.pack("<d", value))
    return struct.unpack("<d", struct.pack("<q", bits ^ 1))[0]


def test_gradbridge_parity_replays_a_spark_history_on_its_threads(thread_runs, tmp_path, capsys):
    """`gradbridge parity --spark-history` as a user runs it, on the history of the run on 2 threads a task:
    it replays on the history's count by itself (the default without it would be 1), says so, and is bitwise;
    the same history with one loss bit changed is a mismatch (exit 1); a history without the keys the replay
    needs, or of another rule, or whose lines disagree, and other rows than the run's are refused in one line
    naming the file (and epoch) and the key."""
    case = thread_runs
    history = case["histories"][2]
    result = gradbridge_cli("parity", case["model"], "--data", case["npz"], "--spark-history", history)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("replaying on 2 intra-op threads, as the Spark tasks ran") for line in lines), lines
    assert "2 partitions, batch 2048, seed 0, shuffled" in lines[0], lines
    assert lines[-1] == "spark: bitwise identical over 1 epochs", lines

    # the same command line in this process (main(), what the subprocess ran), to spare two interpreter starts
    tampered = tmp_path / "tampered.jsonl"
    _edited(history, tampered, lambda line: {**line, "loss": _last_bit_flipped(line["loss"])})
    capsys.readouterr()
    assert cli_main(["parity", str(case["model"]), "--data", str(case["npz"]), "--spark-history", str(tampered)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("spark: diverged at epoch 0 (rtol=0, atol=0): loss"), out

    bare = tmp_path / "bare.jsonl"
    _edited(history, bare, lambda line: {k: v for k, v in line.items() if k not in ("threads", "sharded")})
    assert cli_main(["parity", str(case["model"]), "--data", str(case["npz"]), "--spark-history", str(bare)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith(f'{CLI_ERROR_PREFIX}{bare} (epoch 0): no "threads" key'), captured.err

    # in this process, before anything trains: a history of an older gradbridge-spark (threads, no "sharded"),
    # one of another rule, one whose lines disagree, and other rows than the run's
    cases = {
        "old": (lambda line: {k: v for k, v in line.items() if k != "sharded"}, 'no "sharded" key'),
        "rule": (lambda line: {**line, "sharded": {**line["sharded"], "rule": "ring"}}, 'holds rule "ring"'),
    }
    for name, (edit, expected) in cases.items():
        edited = tmp_path / f"{name}.jsonl"
        _edited(history, edited, edit)
        with pytest.raises(InvalidInputError, match=re.escape(f"{edited} (epoch 0): ") + ".*" + re.escape(expected)):
            reference.train_sharded(case["model"], case["x"], case["y"], run=edited)
    with pytest.raises(InvalidInputError, match=re.escape(f"{tmp_path / 'none.jsonl'}: no such file")):
        spark_history.read(tmp_path / "none.jsonl")
    two = History.load(history)
    two.append(dataclasses.replace(two[0], epoch=1, threads=3))
    with pytest.raises(InvalidInputError, match=re.escape('runs (epoch 1): "threads" is 3, not as in epoch 0')):
        spark_history.read(two, "runs")
    with pytest.raises(InvalidInputError, match=re.escape(f"other rows is not the data {history}'s run trained on")):
        reference.train_sharded(case["model"], case["x"][::-1].copy(), case["y"], run=history, source="other rows")


@pytest.mark.parametrize("exchange, one_round, name", [
    ("", "default", "gloo all-gather of whole records"), ("", "P", "gloo all-to-all + all-gather"),
    ("relay", "default", "relay reduce-scatter + all-gather")], ids=["gloo-one-round", "gloo-by-chunk", "relay"])
def test_k3_each_exchange_equals_the_replay(work, tmp_path, exchange, one_round, name):
    """Three partitions: Gloo (the default) in one round, as this small gradient goes, and by chunk
    (oneRoundBytes = P, the gradient's bytes: a task would receive 2P in one round; chunks of unequal
    sizes, the all-gather padded), and the driver relay (spark.gradbridge.exchange=relay) give the
    replay's bits."""
    parameters = list(torch.jit.load(str(work["models"]["sgd"])).parameters())
    gradient_bytes = 4 * sum(int(np.prod(p.shape)) for p in parameters)
    history = tmp_path / "h.jsonl"
    _, stats = spark_train("--model", work["models"]["sgd"], "--data", work["npz"], "--epochs", 1,
                           "--history", history, master="local[3]", exchange=exchange,
                           one_round_bytes=gradient_bytes if one_round == "P" else None)
    replay = reference.train_sharded(work["models"]["sgd"], work["x"], work["y"], epochs=1, shards=3,
                                     batch_size=BATCH)
    assert_bitwise(History.load(history), replay)
    assert stats["exchange"] == name, stats
    if name.startswith("gloo all-gather"):
        assert stats["bytes_sent"] == stats["steps"] * gloo_one_round_bytes_per_step(parameters, 3), stats
    if name.startswith("gloo all-to-all"):
        assert stats["bytes_sent"] == stats["steps"] * gloo_bytes_per_step(parameters, 3), stats


def test_adam_k1_equals_the_replay_and_single_process_training(work, tmp_path):
    """One partition: the weight is 1 and g * 1 is g, so the run is plain single-process training; the
    task exchanges nothing."""
    history = tmp_path / "h.jsonl"
    _, stats = spark_train("--model", work["models"]["adam"], "--data", work["npz"], "--epochs", EPOCHS, "--history", history,
                master="local[1]")
    java = History.load(history)
    assert_bitwise(java, reference.train_sharded(work["models"]["adam"], work["x"], work["y"], epochs=EPOCHS,
                                                 shards=1, batch_size=BATCH))
    assert_bitwise(java, reference.train(work["models"]["adam"], work["x"], work["y"], epochs=EPOCHS,
                                         batch_size=BATCH))
    assert (stats["bytes_sent"], stats["bytes_received"], stats["exchange"]) == (0, 0, "none (one partition)")


def test_matrix(work, tmp_path, matrix_case):
    """Optimizer x K x shuffle, bit for bit against the replay (--full: all twelve cases)."""
    optimizer, k, shuffle = matrix_case
    history = tmp_path / "h.jsonl"
    spark_train("--model", work["models"][optimizer], "--data", work["npz"], "--epochs", EPOCHS,
                "--shuffle" if shuffle else "--no-shuffle", "--history", history, master=f"local[{k}]")
    replay = reference.train_sharded(work["models"][optimizer], work["x"], work["y"], epochs=EPOCHS, shards=k,
                                     batch_size=BATCH, shuffle=shuffle)
    assert_bitwise(History.load(history), replay)


# ---- models of several inputs: one Parquet column (or .npz array) per input, named as the metadata names it ----

class MaskedTokens(torch.nn.Module):
    """Token ids and an attention mask taken as keywords (``**kwargs``, as HF models): traced."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(30, 6)
        self.out = torch.nn.Linear(6, 3)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        h = self.embed(input_ids) * attention_mask.unsqueeze(-1).to(torch.float32)
        return self.out(h.sum(1) / attention_mask.sum(1, keepdim=True))


@pytest.fixture(scope="module")
def several(tmp_path_factory):
    """The recommender and the masked-token model (Adam, cross-entropy), each with its data as .npz and as
    Parquet (user and item: bigint columns, context and y: array<float>; input_ids and attention_mask:
    array<bigint>)."""
    folder = tmp_path_factory.mktemp("spark-several")
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    tokens = MaskedTokens()
    mask = (torch.arange(7) < torch.randint(2, 8, (48, 1), generator=g)).to(torch.int64)
    x = {"input_ids": torch.randint(0, 30, (48, 7), generator=g), "attention_mask": mask}
    y = torch.randint(0, 3, (48,), generator=g)
    path = export_training_module(tokens, "cross_entropy", torch.optim.Adam(tokens.parameters(), lr=0.01),
                                  folder / "tokens.pt", example_inputs=({k: t[:8] for k, t in x.items()}, y[:8]))
    assert protocol.read_metadata(path)["capture"]["kind"] == "trace"
    cases = {"recommender": recommender_case(folder), "tokens": data_case(folder, "tokens", tokens, path, x, y)}
    sparkrun.to_parquet([(case["npz"], case["parquet"]) for case in cases.values()])
    return {"folder": folder, **cases}


def test_several_inputs_on_parquet_with_a_lost_executor_equal_the_users_model(several, tmp_path):
    """The recommender, K=2 shuffled on Parquet (a column per input), a task failing after its JVM dropped
    its cached partitions: the retried stage rebuilds them from the columns, and the epoch equals the
    replay on the user's eager nn.Module. Its checkpoint is the next test's start."""
    case = several["recommender"]
    history = tmp_path / "h.jsonl"
    checkpoint = several["folder"] / "recommender_epoch1.pt"
    _, stats = spark_train("--model", case["path"], "--data", case["parquet"], "--epochs", 1, "--batch-size", 16,
                           "--history", history, "--checkpoint", checkpoint, "--inject-fault", "executor@0:2:1",
                           master="local[2,2]")
    replay = reference.train_sharded(case["path"], case["x"], case["y"], epochs=1, shards=2, batch_size=16,
                                     model=case["model"])
    assert_bitwise(History.load(history), replay)
    assert stats["stages_retried"] >= 1 and stats["steps"] == 6, stats
    saved = protocol.read_metadata(checkpoint)["checkpoint"]
    assert saved["shards_sha256"] == reference.shards_sha256(case["x"], case["y"], 2)
    assert saved["x_shape"] == [90]  # the first input's, as the single-process Trainer writes it


def test_several_inputs_resume_on_npz_equals_the_users_model(several, tmp_path):
    """The same rows as an .npz (one array per input): the same fingerprint, so the resume continues the run."""
    case = several["recommender"]
    checkpoint = several["folder"] / "recommender_epoch1.pt"
    if not checkpoint.exists():
        pytest.fail("the previous test writes the checkpoint this test resumes")
    history = tmp_path / "h.jsonl"
    spark_train("--resume", checkpoint, "--data", case["npz"], "--epochs", 1, "--history", history,
                master="local[2]")
    replay = reference.train_sharded(case["path"], case["x"], case["y"], epochs=2, shards=2, batch_size=16,
                                     model=case["model"])
    resumed = History.load(history)
    assert [r.epoch for r in resumed] == [1]
    assert_bitwise(resumed, [replay[1]])


def test_a_traced_model_with_an_attention_mask_k1_equals_the_users_eager_model(several, tmp_path):
    """input_ids and attention_mask as array<bigint> columns, one partition: plain training, bit for bit
    the user's eager nn.Module trained by reference.train on a dict of arrays."""
    case = several["tokens"]
    history = tmp_path / "h.jsonl"
    spark_train("--model", case["path"], "--data", case["parquet"], "--epochs", EPOCHS, "--batch-size", 8,
                "--history", history, master="local[1]")
    java = History.load(history)
    assert_bitwise(java, reference.train(case["path"], case["x"], case["y"], epochs=EPOCHS, batch_size=8,
                                         model=case["model"]))
    assert_bitwise(java, reference.train_sharded(case["path"], case["x"], case["y"], epochs=EPOCHS, shards=1,
                                                 batch_size=8, model=case["model"]))


def test_a_protocol_3_module_k2_shuffled_equals_the_users_model(work, tmp_path):
    """A module captured with torch.export (format="export"), K=2 shuffled: each replica's
    gradients out of the native interpreter, the combined gradients set back, torch.optim's step, bit for bit
    the replay on the user's eager nn.Module; its epoch-end checkpoint resumes the run."""
    from gradbridge import models

    torch.manual_seed(0)
    model = models.mlp(hidden=(16,))
    x, y = torch.from_numpy(work["x"]), torch.from_numpy(work["y"])
    path = export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters(), lr=0.01),
                                  tmp_path / "p3.pt", example_inputs=(x[:8], y[:8]), format="export")
    history, checkpoint = tmp_path / "h.jsonl", tmp_path / "epoch1.pt"
    spark_train("--model", path, "--data", work["npz"], "--epochs", 1, "--batch-size", BATCH,
                "--history", history, "--checkpoint", checkpoint, master="local[2]")
    replay = reference.train_sharded(path, work["x"], work["y"], epochs=2, shards=2, batch_size=BATCH, model=model)
    assert_bitwise(History.load(history), replay[:1])
    resumed = tmp_path / "resumed.jsonl"
    spark_train("--resume", checkpoint, "--data", work["npz"], "--epochs", 1, "--history", resumed, master="local[2]")
    assert_bitwise(History.load(resumed), replay[1:])


# ---- the definition, in Python alone (no Spark) ----

#: Measured: 5 epochs of 8 steps, MLP 4 -> 16 -> 3, K = 2 and 4, SGD and Adam: max |dparam| 8.9e-8,
#: max |depoch loss| 6.1e-8. The bound leaves a factor of 10.
SINGLE_PROCESS_BOUND = 1e-6


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("shards", [2, 4])
def test_sharded_replay_against_single_process_training(work, optimizer, shards):
    """K > 1 is single-process training up to float rounding, not bit for bit: the mean over N rows
    is one reduction, the weighted sum of K shard means rounds the weights, the products and the
    partial sums differently. The difference is a few ulps per step and stays below the bound."""
    path = work["models"][optimizer]
    single = reference.train(path, work["x"], work["y"], epochs=5, batch_size=BATCH)
    sharded = reference.train_sharded(path, work["x"], work["y"], epochs=5, shards=shards, batch_size=BATCH)
    worst = max(float(np.abs(a.parameters[n] - b.parameters[n]).max())
                for a, b in zip(single, sharded) for n in a.parameters)
    losses = max(abs(a.loss - b.loss) for a, b in zip(single, sharded))
    assert 0 < worst <= SINGLE_PROCESS_BOUND, worst
    assert losses <= SINGLE_PROCESS_BOUND, losses


def test_combine_shards_is_the_weighted_sum_in_partition_order():
    """float32: w rounded to float32, each product and sum rounded, the first shard first."""
    g = [torch.tensor([1.0, 3.0], dtype=torch.float32), torch.tensor([2.0, 5.0], dtype=torch.float32)]
    loss, combined = reference.combine_shards([(1, 0.5, [g[0], None]), (2, 0.25, [g[1], g[1]])])
    w0, w1 = np.float32(1 / 3), np.float32(2 / 3)
    expected = np.float32(np.float32(1.0) * w0) + np.float32(np.float32(2.0) * w1)
    assert combined[0][0].item() == float(np.float32(expected))
    assert torch.equal(combined[1], g[1].mul(2 / 3))  # only shard 1 has a gradient for it
    assert loss == (1 / 3) * 0.5 + (2 / 3) * 0.25


def test_set_gradients_checks_its_arguments(work):
    """set_gradients (protocol 2) refuses a wrong count, shape or dtype, and a gradient for a frozen
    parameter, changing nothing; gradient_flags reports what it set."""
    from gradbridge._runtime.torchscript import load_for_python

    module = load_for_python(work["models"]["sgd"])
    grads = [torch.ones_like(p) for p in module.get_parameters()]
    flags = torch.tensor([True, False, True, True])
    module.set_gradients(grads, flags)
    assert module.gradient_flags().tolist() == [True, False, True, True]
    assert torch.equal(module.get_gradients()[1], torch.zeros_like(grads[1]))
    with pytest.raises(torch.jit.Error, match="expected 4 tensors and 4 flags, got 3 and 4"):
        module.set_gradients(grads[:3], flags)
    with pytest.raises(torch.jit.Error, match="must have shape"):
        module.set_gradients([g.double() for g in grads], flags)
    assert module.gradient_flags().tolist() == [True, False, True, True]


def test_set_gradients_refuses_a_gradient_for_a_frozen_parameter(tmp_path):
    from gradbridge._runtime.torchscript import load_for_python

    path = export_builtin("mlp", tmp_path / "frozen.pt", seed=0, in_features=4, hidden=(8,), out_features=3,
                          loss={"name": "cross_entropy"}, optimizer={"name": "sgd", "lr": 0.1},
                          inputs=[protocol.tensor_spec("x", [-1, 4], "float32"), protocol.tensor_spec("y", [-1], "int64")],
                          fine_tuning={"freeze": ["0."]})
    module = load_for_python(path)
    grads = [torch.ones_like(p) for p in module.get_parameters()]
    with pytest.raises(torch.jit.Error, match="0.weight is frozen and cannot hold a gradient"):
        module.set_gradients(grads, torch.tensor([True] * 4))
    module.set_gradients(grads, torch.tensor([False, False, True, True]))
    assert module.gradient_flags().tolist() == [False, False, True, True]


# ---- how it runs outside pytest: gradle sparkTrain, and the jar spark-submit takes (--full: ~2 minutes) ----

@pytest.fixture
def full_only(request):
    if not request.config.getoption("--full"):
        pytest.skip("packaging: runs with --full (builds a 120 MB jar)")


def test_gradle_spark_train(work, tmp_path, full_only):
    from gradbridge._runtime.gradle import run_task

    history = tmp_path / "h.jsonl"
    result = run_task(":spark:sparkTrain", ["--model", str(work["models"]["sgd"]), "--data", str(work["parquet"]),
                                            "--master", "local[2]", "--epochs", "1", "--history", str(history)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "spark: 2 partitions, 7 steps" in result.stdout
    # gradle's JVM runs the pytorch-native-cpu jar's libtorch, not this Python's: compared within float rounding
    replay = reference.train_sharded(work["models"]["sgd"], work["x"], work["y"], epochs=1, shards=2, batch_size=BATCH)
    java = History.load(history)
    assert abs(java[0].loss - replay[0].loss) <= 1e-6


def test_spark_submit_jar_runs_on_sparks_own_classpath(work, tmp_path, full_only):
    """The jar holds gradbridge-spark, gradbridge and libtorch (the pytorch-native-cpu jar) but no Spark: beside
    Spark's jars (what spark-submit provides) it trains; the run equals the replay within float rounding."""
    import subprocess
    import zipfile

    from gradbridge._runtime import devtree as _devtree, jdk
    from gradbridge._runtime.gradle import run_task

    root = _devtree.require_root("the spark-submit jar")
    built = run_task(":spark:sparkSubmitJar")
    assert built.returncode == 0, built.stderr[-3000:]
    jar = next((root / "spark" / "build" / "libs").glob("gradbridge-spark-submit_2.13-*.jar"))
    names = zipfile.ZipFile(jar).namelist()
    assert "dev/gradbridge/spark/SparkTrainCommand.class" in names and "dev/gradbridge/TrainingModule.class" in names
    assert not any(n.startswith("org/apache/spark/") for n in names)
    provided = (root / sparkrun.CLASSPATH_FILE).with_name("gradbridge-spark-provided-classpath.txt").read_text().strip()
    flags = [f for f in (root / sparkrun.JVM_ARGS_FILE).read_text().split() if "log4j2" not in f]
    history = tmp_path / "h.jsonl"
    result = subprocess.run([jdk.checked_java(), *flags, "-cp", f"{jar}:{provided}", sparkrun.SPARK_MAIN,
                             "--model", str(work["models"]["adam"]), "--data", str(work["parquet"]),
                             "--master", "local[2]", "--epochs", "1", "--history", str(history)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    replay = reference.train_sharded(work["models"]["adam"], work["x"], work["y"], epochs=1, shards=2, batch_size=BATCH)
    assert abs(History.load(history)[0].loss - replay[0].loss) <= 1e-6
