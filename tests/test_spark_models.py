"""gradbridge-spark on the models people fine-tune: dropout and buffers, on an embedded Spark ``local[2]``
(``local[3]`` once), bit for bit against the replay on the user's own eager nn.Module
(``reference.train_sharded``), the replay on the tasks' libtorch threads by itself (no
``torch.set_num_threads`` here).

- an MLP with dropout (and the same in bfloat16, its inputs float32 arrays): each partition's forward and backward of each step draws from libtorch's generator
  seeded from the run's seed, the step's number and the partition (``shuffle.step_seed``), and the two tasks
  of one JVM take turns for it;
- a CNN with BatchNorm: after each step the running statistics of the step's first partition with rows are
  every replica's, over Gloo (K=2) and through the driver's relay (K=3), each with steps where partition 0
  holds no row; the checkpoint's buffers equal the replay's;
- HF BERT (the zoo's, dropout on) fed ``input_ids`` and ``attention_mask`` as Parquet columns (its constant
  ``position_ids``/``token_type_ids`` buffers travel with the module, nothing per step), and a Llama-style
  decoder with its rotary ``inv_freq`` buffer and attention dropout.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradbridge import export_training_module, protocol, reference
from gradbridge._runtime import shuffle, sparkrun
from gradbridge.history import History
from gradbridge.models import SmallCNN, mlp
from tests.models import zoo
from tests.spark_support import assert_bitwise, spark_train


def _export(model, x, y, path, optimizer=None):
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    example = ({k: v[:4] for k, v in x.items()} if isinstance(x, dict) else x[:4], y[:4])
    return export_training_module(model, "cross_entropy", optimizer, path, example_inputs=example)


def _save(folder, name, x, y):
    arrays = {k: v.numpy() for k, v in x.items()} if isinstance(x, dict) else {"x": x.numpy()}
    np.savez(folder / f"{name}.npz", **arrays, y=y.numpy())
    return folder / f"{name}.npz", (arrays if isinstance(x, dict) else arrays["x"]), y.numpy()


def test_dropout_k2_equals_the_replay(tmp_path):
    """Dropout 0.3 after each hidden layer, K=2 shuffled: every step's masks are the replay's; the history
    records the tasks' one thread, which the replay runs on."""
    torch.manual_seed(0)
    model = mlp(in_features=4, hidden=(16, 16), out_features=3, dropout=0.3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(120, 4, generator=g), torch.randint(0, 3, (120,), generator=g)
    path = _export(model, x, y, tmp_path / "dropout.pt")
    assert protocol.read_metadata(path)[protocol.CAPTURE_KEY][protocol.DRAWS_RANDOM_KEY] is True
    data, xs, ys = _save(tmp_path, "dropout", x, y)
    history = tmp_path / "h.jsonl"
    _, stats = spark_train("--model", path, "--data", data, "--epochs", 2, "--batch-size", 32, "--history", history,
                           master="local[2]")
    java = History.load(history)
    replay = reference.train_sharded(path, xs, ys, epochs=2, shards=2, batch_size=32, model=model)
    assert_bitwise(java, replay)
    assert [r.threads for r in java] == [1, 1] and stats["threads"] == [1, 1]
    # the masks matter: the same run on another seed's draws (and order) is another run
    other = reference.train_sharded(path, xs, ys, epochs=1, shards=2, batch_size=32, model=model, seed=1)
    assert other[0].loss != replay[0].loss


def test_a_bfloat16_model_k2_equals_the_replay(tmp_path):
    """bfloat16 weights, inputs and AdamW state (issue 48), dropout on: the .npz holds the inputs as float32
    (numpy has no bfloat16) and the module's metadata casts them; K=2 bit for bit, in bfloat16."""
    torch.manual_seed(0)
    model = mlp(in_features=4, hidden=(16, 16), out_features=3, dropout=0.3).to(torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(120, 4, generator=g).to(torch.bfloat16), torch.randint(0, 3, (120,), generator=g)
    path = _export(model, x, y, tmp_path / "bf16.pt", torch.optim.AdamW(model.parameters(), lr=1e-2))
    assert {p["dtype"] for p in protocol.read_metadata(path)["parameters"]} == {"bfloat16"}
    data, xs, ys = _save(tmp_path, "bf16", x.float(), y)
    history = tmp_path / "h.jsonl"
    spark_train("--model", path, "--data", data, "--epochs", 2, "--batch-size", 32, "--history", history,
                master="local[2]")
    assert_bitwise(History.load(history),
                   reference.train_sharded(path, xs, ys, epochs=2, shards=2, batch_size=32, model=model))


def _partition_zero_idle(rows: int, batch: int, shards: int, epochs: int) -> bool:
    """Whether some step of the (seed 0, shuffled) run has no row of partition 0."""
    for epoch in range(epochs):
        order = shuffle.permutation(protocol.DEFAULT_SEED, epoch, rows)
        if any(all(i % shards for i in order[s:s + batch]) for s in range(0, rows, batch)):
            return True
    return False


@pytest.mark.parametrize("exchange, k", [("", 2), ("relay", 3)], ids=["gloo-K2", "relay-K3"])
def test_batchnorm_k_equals_the_replay_and_its_buffers(tmp_path, exchange, k):
    """SmallCNN (two BatchNorm2d), 49 rows in batches of 16 (a last batch of one row): the statistics of
    each step's first partition with rows become every replica's; the history and the checkpoint's
    running_mean, running_var and num_batches_tracked equal the replay's bit for bit."""
    torch.manual_seed(0)
    model = SmallCNN(side=8, channels=4, classes=3)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(49, 1, 8, 8, generator=g), torch.randint(0, 3, (49,), generator=g)
    path = _export(model, x, y, tmp_path / "cnn.pt")
    trained = [b["name"] for b in protocol.read_metadata(path)["buffers"] if b["trained"]]
    assert len(trained) == 6  # two BatchNorms' running_mean, running_var, num_batches_tracked
    assert _partition_zero_idle(49, 16, k, 2)  # some step's first partition with rows is not partition 0
    data, xs, ys = _save(tmp_path, "cnn", x, y)
    history, checkpoint = tmp_path / "h.jsonl", tmp_path / "run.pt"
    spark_train("--model", path, "--data", data, "--epochs", 2, "--batch-size", 16, "--history", history,
                "--checkpoint", checkpoint, master=f"local[{k}]", exchange=exchange)
    replay = reference.train_sharded(path, xs, ys, epochs=2, shards=k, batch_size=16, model=model)
    assert_bitwise(History.load(history), replay)
    saved = reference.initial_state(checkpoint)
    for name in trained:
        assert np.array_equal(saved[name].double().numpy().ravel(), replay.buffers[name]), name
    assert replay.buffers["features.1.num_batches_tracked"][0] == 2 * 4  # one per step, not per partition


@pytest.fixture(scope="module")
def bert_case(tmp_path_factory):
    """The zoo's BERT (hidden and attention dropout 0.1) and 16 rows of padded token ids with their mask, as
    Parquet columns input_ids and attention_mask (array<bigint>) and y (bigint)."""
    folder = tmp_path_factory.mktemp("spark-bert")
    torch.manual_seed(0)
    model = zoo.bert()
    x, y = zoo._tokens(16, 3)
    path = _export(model, x, y, folder / "bert.pt", torch.optim.AdamW(model.parameters(), lr=1e-3))
    data, xs, ys = _save(folder, "bert", x, y)
    sparkrun.to_parquet([(data, folder / "bert.parquet")])
    return {"model": model, "path": path, "x": xs, "y": ys, "parquet": folder / "bert.parquet"}


def test_bert_with_attention_mask_and_dropout_on_parquet_equals_the_replay(bert_case, tmp_path):
    metadata = protocol.read_metadata(bert_case["path"])
    assert metadata[protocol.CAPTURE_KEY][protocol.DRAWS_RANDOM_KEY] is True
    assert metadata["buffers"] and not any(b["trained"] for b in metadata["buffers"])  # position ids: constant
    history = tmp_path / "h.jsonl"
    spark_train("--model", bert_case["path"], "--data", bert_case["parquet"], "--epochs", 2, "--batch-size", 8,
                "--history", history, master="local[2]")
    replay = reference.train_sharded(bert_case["path"], bert_case["x"], bert_case["y"], epochs=2, shards=2,
                                     batch_size=8, model=bert_case["model"])
    assert_bitwise(History.load(history), replay)


def llama() -> torch.nn.Module:
    """A Llama-style decoder classifier (rotary position embedding: a constant inv_freq buffer), attention
    dropout 0.1."""
    import transformers as hf

    return zoo.TokenClassifier(hf.LlamaForSequenceClassification(hf.LlamaConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=zoo.VOCAB, max_position_embeddings=64, num_labels=zoo.CLASSES, pad_token_id=zoo.PAD,
        attention_dropout=0.1)))


@pytest.mark.slow  # CI's time: --full (one fast case of its kind stays in the default run)
def test_llama_with_its_rotary_buffer_and_dropout_equals_the_replay(tmp_path):
    torch.manual_seed(0)
    model = llama()
    x, y = zoo._tokens(16, 4)
    path = _export(model, x, y, tmp_path / "llama.pt", torch.optim.AdamW(model.parameters(), lr=1e-3))
    buffers = protocol.read_metadata(path)["buffers"]
    assert any(b["name"].endswith("inv_freq") for b in buffers) and not any(b["trained"] for b in buffers)
    data, xs, ys = _save(tmp_path, "llama", x, y)
    history = tmp_path / "h.jsonl"
    spark_train("--model", path, "--data", data, "--epochs", 1, "--batch-size", 6, "--history", history,
                master="local[2]")
    replay = reference.train_sharded(path, xs, ys, epochs=1, shards=2, batch_size=6, model=model)
    assert_bitwise(History.load(history), replay)
