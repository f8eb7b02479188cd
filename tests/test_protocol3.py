"""Protocol 3 (``export_training_module(..., format="export")``): the training step captured with torch.export
as gradbridge's op lists and run op by op by the native layer. An MLP with dropout and the zoo's BERT with
its attention mask, trained from Java (in this process and in a JVM of its own) bit for bit like the user's
eager nn.Module and torch.optim, with validation; what protocol 3 does not hold yet refused in one line, and
every bad protocol-3 file refused in one line naming what is wrong."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import torch
from torch import nn

from gradbridge import export_training_module, java, messages, protocol, reference
from gradbridge._runtime import launcher, oplist
from gradbridge.errors import ExportError, GradbridgeError
from gradbridge._runtime.program import read_program
from gradbridge.jvm import load_module
from tests.faults import TRAIN_SCRIPT, one_error_line, train_cli
from tests.models import zoo
from tests.online_support import host_tensor
from tests.protocol3_support import (BATCH, N, deep_mlp, export_protocol_3, java_state, mlp_data, tensor_values,
                                     torch_layout)

#: The cases `make test` runs on the newest torch too: the models and optimizers trained from Java (the ops a torch
#: release can change); the file's layout, its refusals and the tools around it run on the oldest.
NEWEST = pytest.mark.every_torch_java


def _same(a, b):
    assert [(r.loss, r.val_loss) for r in a] == [(r.loss, r.val_loss) for r in b]
    assert [r.digests for r in a] == [r.digests for r in b]


def _trains_like_eager(path, model, x, y, **settings):
    """Java in this process and the user's eager model with torch.optim, on x and y (tensors): the same run."""
    _same(java.train(path, x.numpy(), y.numpy(), **settings),
          reference.train(path, x.numpy(), y.numpy(), model=model, **settings))


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    model = _mlp()
    x, y = mlp_data(0)
    path = tmp_path_factory.mktemp("p3") / "mlp.pt"
    export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.1),
                           path, example_inputs=(x[:BATCH], y[:BATCH]), format="export")
    return model, path


def test_the_file_is_a_zip_of_metadata_op_lists_and_state(mlp):
    _, path = mlp
    metadata = protocol.read_metadata(path)
    assert metadata["protocol_version"] == protocol.EXPORT_PROTOCOL_VERSION == 3
    assert tuple(metadata)[:len(protocol.METADATA_KEYS)] == protocol.METADATA_KEYS
    assert metadata["capture"] == {"kind": "export", "checked": True, "draws_random": True}
    program = metadata[protocol.PROGRAM_KEY]
    # each batch-dependent graph again at one sample (torch.export specializes on size 1): a batch of one runs it
    assert set(program["graphs"]) == {"train", "forward", "loss", "optimizer", "train@1", "forward@1", "loss@1"}
    assert program["min_batch"] == 1
    with zipfile.ZipFile(path) as archive:
        train = json.loads(archive.read(program["graphs"]["train"]))
        assert {e["file"] for e in program["state"]} <= set(archive.namelist())
    assert train["oplist_version"] == oplist.VERSION
    ops = [node["op"] for node in train["nodes"]]
    # eager's CPU dropout (a bernoulli_ mask drawn in place, divided by 1 - p, multiplied in), not native_dropout
    assert "aten::bernoulli_" in ops and "aten::native_dropout" not in ops
    assert {o["to"] for o in train["outputs"]} == {"loss"} | {f"grad:{n}" for n, _ in _mlp().named_parameters()}


@NEWEST
@pytest.mark.parametrize("mode", ["step", "fused", "full"])
def test_java_trains_an_mlp_with_dropout_like_the_users_model(jvm, mlp, mode):
    model, path = mlp
    x, y = mlp_data(0)
    vx, vy = mlp_data(1)
    settings = dict(epochs=2, batch_size=BATCH, mode=mode, val=(vx.numpy(), vy.numpy()))
    _trains_like_eager(path, model, x, y, **settings)


def _tokens():
    """N rows of 6 tokens of 16 features, 3 classes."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 6, 16, generator=g), torch.randint(0, 3, (N,), generator=g)


class _Encoder(nn.Module):
    """The bench transformer's shape, small: batch-first encoder layers (dropout 0.1 in training), mean-pooled."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


@NEWEST
@pytest.mark.parametrize("mode", ["step", "fused"])
def test_java_trains_a_transformer_encoder_with_dropout_like_the_users_model(jvm, tmp_path, mode):
    """Dropout after a batch-first attention draws its mask into a transposed tensor (eager's in-place
    ``bernoulli_``, in that memory order), and eager evaluates under no_grad with the layer's native kernel:
    the op lists do the same, bit for bit."""
    torch.manual_seed(0)
    model = _Encoder()
    x, y = _tokens()
    path = export_protocol_3(tmp_path / "encoder.pt", model, torch.optim.Adam(model.parameters(), lr=1e-2), data=(x, y))
    graphs = read_program(path)[1]
    assert "aten::bernoulli_" in {n["op"] for n in graphs["train"]["nodes"]}
    assert "aten::_transformer_encoder_layer_fwd" in {n["op"] for n in graphs["forward"]["nodes"]}
    settings = dict(epochs=2, batch_size=BATCH, mode=mode, val=(x[:BATCH].numpy(), y[:BATCH].numpy()))
    _trains_like_eager(path, model, x, y, **settings)


class _Attention(nn.Module):
    """nn.MultiheadAttention itself (batch-first self-attention, dropout 0.1), mean-pooled."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 2, dropout=0.1, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        out, _ = self.attention(x, x, x, need_weights=False)
        return self.head(out.mean(1))


@NEWEST
@pytest.mark.parametrize("mode", ["step", "fused"])
def test_java_trains_a_multihead_attention_like_the_users_model(jvm, tmp_path, mode):
    """eager evaluates nn.MultiheadAttention under no_grad with its native kernel (its fast path), which
    newer torches skip while tracing: the eval graphs run eager's kernel, bit for bit."""
    torch.manual_seed(0)
    model = _Attention()
    x, y = _tokens()
    path = export_protocol_3(tmp_path / "attention.pt", model, torch.optim.Adam(model.parameters(), lr=1e-2), data=(x, y))
    graphs = read_program(path)[1]
    assert "aten::_native_multi_head_attention" in {n["op"] for n in graphs["forward"]["nodes"]}
    assert "aten::_native_multi_head_attention" not in {n["op"] for n in graphs["train"]["nodes"]}
    settings = dict(epochs=2, batch_size=BATCH, mode=mode, val=(x[:BATCH].numpy(), y[:BATCH].numpy()))
    _trains_like_eager(path, model, x, y, **settings)


class _Recurrent(nn.Module):
    """The bench LSTM's shape, small: a recurrent layer over sequences, the last step's output."""

    def __init__(self, rnn, features):
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(features, 3)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def _sequences(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, 5, 4, generator=g), torch.randint(0, 3, (N,), generator=g)


@pytest.fixture(scope="module")
def lstm(tmp_path_factory):
    torch.manual_seed(0)
    model = _Recurrent(nn.LSTM(4, 8, num_layers=2, batch_first=True, dropout=0.3), 8)
    path = export_protocol_3(tmp_path_factory.mktemp("p3") / "lstm.pt", model, torch.optim.Adam(model.parameters(), lr=1e-2),
                   data=_sequences(0))
    return model, path


@NEWEST
@pytest.mark.parametrize("mode", ["step", "fused"])
def test_java_trains_an_lstm_with_dropout_between_layers_like_the_users_model(jvm, lstm, mode):
    """eager runs a CPU LSTM as oneDNN's layer kernel, whose backward gives both biases one gradient and reads
    the workspace its forward keeps only with grad mode on: the op lists run that kernel so (the forward
    of a training graph with grad mode on), each bias with a gradient of its own; dropout between layers."""
    model, path = lstm
    train = read_program(path)[1]["train"]
    assert {"aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward", "aten::bernoulli_"} <= {
        n["op"] for n in train["nodes"]}
    assert 0 < oplist.forward_ops(train) < len(train["nodes"])
    x, y = _sequences(0)
    vx, vy = _sequences(1)
    settings = dict(epochs=2, batch_size=BATCH, mode=mode, val=(vx.numpy(), vy.numpy()))
    _trains_like_eager(path, model, x, y, **settings)


@NEWEST
@pytest.mark.parametrize("rnn", [lambda: nn.GRU(4, 32, num_layers=2, batch_first=True, dropout=0.2),
                                 lambda: nn.RNN(4, 8, nonlinearity="relu", batch_first=True)], ids=["gru", "rnn"])
def test_java_trains_a_gru_and_an_rnn_like_the_users_model(jvm, tmp_path, rnn):
    """The GRU's hidden size a multiple of 32: eager's in-place gate ops on strided views and the op lists'
    out-of-place ones on fresh tensors then take the same vectorized kernel paths."""
    torch.manual_seed(0)
    layer = rnn()
    model = _Recurrent(layer, layer.hidden_size)
    x, y = _sequences(0)
    path = export_protocol_3(tmp_path / "rnn.pt", model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), data=(x, y))
    settings = dict(epochs=2, batch_size=BATCH, mode="fused", val=(x[:BATCH].numpy(), y[:BATCH].numpy()))
    _trains_like_eager(path, model, x, y, **settings)


@pytest.mark.slow
def test_a_gru_the_op_lists_cannot_follow_bit_for_bit_is_refused_in_one_line(tmp_path):
    """Hidden size 8: eager's in-place gate ops run on rows of 8 floats of a strided view, the graph's on whole
    contiguous tensors; vectorized sigmoid and tanh then round some elements otherwise (in training or in
evaluation, whichever the check meets first). The check refuses it."""
    torch.manual_seed(0)
    model = _Recurrent(nn.GRU(4, 8, batch_first=True), 8)
    x, y = _sequences(0)
    with pytest.raises(ExportError) as info:
        export_training_module(model, "cross_entropy", "sgd", tmp_path / "gru.pt", example_inputs=(x[:BATCH], y[:BATCH]),
                               format="export")
    line = str(info.value)
    assert line.startswith("export check failed: ") and "differs from your eager model" in line, line
    assert "nn.GRU with a hidden size not a multiple of 32" in line and 'format="torchscript"' in line, line
    assert "\n" not in line
    assert not (tmp_path / "gru.pt").exists()


def test_a_large_models_lean_check_steps_once_at_the_examples_size_and_still_refuses(jvm, tmp_path, monkeypatch):
    """A model of self_check.LEAN_CHECK_BYTES or more (lowered here) is checked with one step at the example's size,
    then one at one more and one at one sample; what it passes trains from Java like the user's model, and the GRU
    that the op lists cannot follow is still refused."""
    from gradbridge.export import protocol3_check, self_check
    monkeypatch.setattr(self_check, "LEAN_CHECK_BYTES", 0)
    sizes = []
    original = protocol3_check._run
    monkeypatch.setattr(protocol3_check, "_run", lambda side, where, batches, evaluated: (
        sizes.append([len(by) for _, by in batches]), original(side, where, batches, evaluated))[1])
    model = _mlp()
    x, y = mlp_data(0)
    path = export_protocol_3(tmp_path / "mlp.pt", model, torch.optim.Adam(model.parameters(), lr=1e-2))
    assert sizes == [[BATCH, BATCH + 1, 1]] * 2
    _trains_like_eager(path, _mlp(), x, y, epochs=2, batch_size=BATCH, seed=3)
    torch.manual_seed(0)
    gru = _Recurrent(nn.GRU(4, 8, batch_first=True), 8)
    gx, gy = _sequences(0)
    with pytest.raises(ExportError, match="nn.GRU with a hidden size not a multiple of 32"):
        export_training_module(gru, "cross_entropy", "sgd", tmp_path / "gru.pt", example_inputs=(gx[:BATCH], gy[:BATCH]),
                               format="export")


@NEWEST
@pytest.mark.parametrize("mode", ["step", "fused"])
def test_micro_batches_of_one_sample_train_like_the_users_model(jvm, tmp_path, mode):
    """accumulate=5 splits batches of 8 into [2, 2, 2, 2] and the last batch of 1 into [1]: a micro-batch
    of one runs train_accumulate@1; dropout on."""
    model = _mlp()
    path = export_protocol_3(tmp_path / "m.pt", model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), accumulate=5)
    assert "train_accumulate@1" in read_program(path)[1]
    x, y = mlp_data(0)
    settings = dict(epochs=2, batch_size=BATCH, mode=mode)
    _trains_like_eager(path, model, x[:17], y[:17], **settings)


@pytest.mark.parametrize("mode", ["step", "fused"])
def test_a_last_batch_of_one_sample_trains_like_the_users_model(jvm, mlp, mode):
    """17 samples in batches of 8: the last batch of one runs the graphs captured at one sample."""
    model, path = mlp
    x, y = mlp_data(0)
    settings = dict(epochs=2, batch_size=BATCH, mode=mode, val=(x[:1].numpy(), y[:1].numpy()))
    _trains_like_eager(path, model, x[:17], y[:17], **settings)


def test_a_batch_of_one_is_refused_in_one_line_when_the_model_cannot_run_one(jvm, tmp_path):
    """BatchNorm in training refuses one sample (eager too): the export holds no graphs at one sample, and
    a last batch of one is refused naming the graph."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    x, y = mlp_data(0)
    path = export_training_module(model, "cross_entropy", torch.optim.SGD(model.parameters(), lr=0.1),
                                  tmp_path / "bn.pt", example_inputs=(x[:BATCH], y[:BATCH]), format="export")
    assert protocol.read_metadata(path)[protocol.PROGRAM_KEY]["min_batch"] == 2
    with pytest.raises(GradbridgeError) as info:
        java.train(path, x[:9].numpy(), y[:9].numpy(), epochs=1, batch_size=BATCH, mode="step")
    assert "a batch of 1 samples: this protocol-3 module runs batches of at least 2 (its export captured no graph " \
           "train at one sample)" in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


@NEWEST
def test_java_trains_bert_with_an_attention_mask_in_process_and_in_a_jvm_of_its_own(jvm, tmp_path):
    torch.manual_seed(0)
    model = zoo.bert()
    x, y = zoo._tokens(16, 0)
    vx, vy = zoo._tokens(6, 1)
    path = export_training_module(model, "cross_entropy", torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  tmp_path / "bert.pt", example_inputs=({n: t[:BATCH] for n, t in x.items()}, y[:BATCH]),
                                  format="export")
    arrays = {n: t.numpy() for n, t in x.items()}
    val = ({n: t.numpy() for n, t in vx.items()}, vy.numpy())
    settings = dict(epochs=2, batch_size=BATCH, mode="step")
    eager = reference.train(path, arrays, y.numpy(), model=model, val=val, **settings)
    _same(java.train(path, arrays, y.numpy(), val=val, **settings), eager)
    np.savez(tmp_path / "train.npz", **arrays, y=y.numpy())
    np.savez(tmp_path / "val.npz", **val[0], y=val[1])
    own_jvm = lambda: launcher.train(path, tmp_path / "train.npz", val=tmp_path / "val.npz",  # noqa: E731
                                     history=tmp_path / "h.jsonl", **settings)
    try:
        history = own_jvm()
    except GradbridgeError as ex:  # a checkout's own JVM runs the jar's libtorch: another release is refused
        line = str(ex)
        engine = re.search(r"this JVM runs libtorch (\S+):", line)
        assert engine and _release(engine.group(1)) != _release(torch.__version__), line
        assert "a protocol-3 module (format='export') runs on the torch release it was captured with" in line
        assert "\n" not in line
    else:
        _same(history, eager)


def _release(version):
    return ".".join(version.split("+")[0].split(".")[:2])


def _java_equals_eager(path, model, modes, epochs=3):
    x, y = mlp_data(0)
    vx, vy = mlp_data(1)
    for mode in modes:
        settings = dict(epochs=epochs, batch_size=BATCH, mode=mode, val=(vx.numpy(), vy.numpy()))
        eager = reference.train(path, x.numpy(), y.numpy(), model=model, **settings)
        in_java = java.train(path, x.numpy(), y.numpy(), **settings)
        _same(in_java, eager)
        assert [r.lrs for r in in_java] == [r.lrs for r in eager]


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """Frozen parameters, two parameter groups (their own lr and weight decay), SGD with Nesterov momentum,
    a per-step StepLR, clipping by norm and gradient accumulation, all at once; BatchNorm and dropout on."""
    model = deep_mlp()
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD([{"params": model[4].parameters(), "lr": 0.05, "weight_decay": 0.01},
                                 {"params": [*model[1].parameters(), *model[6].parameters()]}],
                                lr=0.1, momentum=0.9, nesterov=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    path = export_protocol_3(tmp_path_factory.mktemp("p3") / "tuned.pt", model, optimizer, scheduler=scheduler,
                   clip_grad_norm=0.5, accumulate=2)
    return model, path


@NEWEST
@pytest.mark.parametrize("mode", ["step", "fused", "full"])
def test_training_options_train_from_java_like_torch_optim(jvm, fine_tuned, mode):
    model, path = fine_tuned
    metadata = protocol.read_metadata(path)
    assert [p["trainable"] for p in metadata["parameters"]] == [False, False] + [True] * 6
    assert {"train", "train_accumulate", "clip", "optimizer", "optimizer_first"} <= set(metadata["program"]["graphs"])
    _java_equals_eager(path, model, [mode])


def _optimizer(name, model):
    return {
        "sgd_plain": lambda: torch.optim.SGD(model.parameters(), lr=0.1),
        "sgd_dampened": lambda: torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8, dampening=0.3,
                                                weight_decay=0.01, maximize=True),
        "adam_amsgrad": lambda: torch.optim.Adam(model.parameters(), lr=0.01, amsgrad=True, weight_decay=0.1),
        "adamw": lambda: torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.99)),
        "rmsprop": lambda: torch.optim.RMSprop(model.parameters(), lr=0.01, momentum=0.5, centered=True,
                                               weight_decay=0.01),
        "rmsprop_plain": lambda: torch.optim.RMSprop(model.parameters(), lr=0.01),
        "adagrad": lambda: torch.optim.Adagrad(model.parameters(), lr=0.1, lr_decay=0.01, weight_decay=0.01,
                                               initial_accumulator_value=0.1),
    }[name]()


def _scheduler(name, optimizer):
    ls = torch.optim.lr_scheduler
    return {
        None: lambda: None,
        "step": lambda: ls.StepLR(optimizer, step_size=2, gamma=0.5),
        "multistep": lambda: ls.MultiStepLR(optimizer, milestones=[1, 4, 4], gamma=0.5),
        "exponential": lambda: ls.ExponentialLR(optimizer, gamma=0.9),
        "cosine": lambda: ls.CosineAnnealingLR(optimizer, T_max=3, eta_min=0.001),
        "linear": lambda: ls.LinearLR(optimizer, start_factor=0.25, total_iters=4),
        "plateau": lambda: ls.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.5),
        "warmup_cosine": lambda: ls.SequentialLR(optimizer, [ls.LinearLR(optimizer, start_factor=0.1, total_iters=3),
                                                             ls.CosineAnnealingLR(optimizer, T_max=5)], milestones=[4]),
    }[name]()


# (optimizer, scheduler, interval, clipping) in the default run; the rest with --full
FAST = [("rmsprop", "plateau", "epoch", dict(clip_grad_value=0.05)),
        ("adagrad", "cosine", "step", dict(clip_grad_norm=0.3, clip_norm_type=float("inf")))]
SLOW = [(o, None, "step", {}) for o in ("sgd_plain", "sgd_dampened", "adam_amsgrad", "adamw", "rmsprop_plain")] + [
    ("adam_amsgrad", s, i, {}) for s in ("step", "multistep", "exponential", "cosine", "linear", "warmup_cosine")
    for i in ("step", "epoch")] + [("adamw", "plateau", "epoch", dict(clip_grad_norm=0.1, accumulate=3))]


@NEWEST
@pytest.mark.parametrize("name, schedule, interval, options",
                         FAST + [pytest.param(*case, marks=pytest.mark.slow) for case in SLOW])
def test_each_optimizer_and_schedule_trains_from_java_like_torch_optim(jvm, tmp_path, name, schedule, interval,
                                                                        options):
    model = deep_mlp()
    optimizer = _optimizer(name, model)
    path = export_protocol_3(tmp_path / "m.pt", model, optimizer, scheduler=_scheduler(schedule, optimizer),
                   scheduler_interval=interval, **options)
    _java_equals_eager(path, model, ["fused", "step"], epochs=4)


def _one_cycle(optimizer, interval, **options):
    # 4 epochs of N / BATCH steps each, per step; 4 per epoch
    steps = 4 * N // BATCH if interval == "step" else 4
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=steps, **options)


# OneCycleLR: the cycled momentum (SGD, RMSprop) or beta1 (Adam) is a per-step host scalar, as torch.optim reads it
ONE_CYCLE = [
    ("sgd", "step", dict(momentum=0.9, nesterov=True), dict(pct_start=0.4)),
    ("sgd", "epoch", dict(), dict(anneal_strategy="linear")),  # SGD built without momentum: the cycle brings it
    ("rmsprop", "step", dict(centered=True), dict()),  # so for RMSprop, whose first step makes zero buffers
    ("adam", "step", dict(weight_decay=0.01), dict(three_phase=True, base_momentum=0.7, max_momentum=0.9)),
    ("adamw", "epoch", dict(), dict(cycle_momentum=False)),
]


@pytest.mark.parametrize("name, interval, hyper, options",
                         ONE_CYCLE[:3] + [pytest.param(*case, marks=pytest.mark.slow) for case in ONE_CYCLE[3:]])
def test_one_cycle_cycles_momentum_and_beta1_from_java_like_torch_optim(jvm, tmp_path, name, interval, hyper,
                                                                          options):
    model = deep_mlp()
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
           "rmsprop": torch.optim.RMSprop}[name]
    optimizer = cls(model.parameters(), lr=0.01, **hyper)
    path = export_protocol_3(tmp_path / "m.pt", model, optimizer, scheduler=_one_cycle(optimizer, interval, **options),
                   scheduler_interval=interval)
    counters = protocol.read_metadata(path)["program"]["counters"]
    assert len(counters["momenta"]) == (0 if options.get("cycle_momentum") is False else 1)
    _java_equals_eager(path, model, ["fused", "step"], epochs=4)


class _Idle(nn.Module):
    """A model with parameters the loss gives no gradient: a head it never calls, a scale it detaches."""

    def __init__(self):
        super().__init__()
        self.body = deep_mlp()
        self.spare = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.full((3,), 0.5))

    def forward(self, x):
        return self.body(x) * self.scale.detach()


class _Elementwise(nn.Module):
    """A layer of the elementwise and reducing functions models write by hand (soft clipping, log-domain
    pooling, rounding gates), each on the way to the logits."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = self.fc(x)
        parts = [torch.clamp_min(h, -1.0), torch.clamp_max(h, 1.0), torch.clamp(h, -h.abs().mean(), h.abs().mean()),
                 torch.maximum(h, 0.5 * h), torch.minimum(h, 0.5 * h), torch.log1p(h.abs()), torch.expm1(-h.abs()),
                 torch.log2(1 + h * h), torch.log10(2 + h * h), torch.tan(0.5 * torch.tanh(h)), torch.erf(h),
                 torch.erfc(h), torch.exp2(-h * h), torch.pow(h.abs() + 1, torch.sigmoid(h)), torch.pow(2.0, -h.abs()),
                 torch.where(h > 0, h, 0.0), torch.where(h > 0, 0.1, h), h * torch.sign(h), h - h.detach().floor(),
                 h - h.detach().ceil(), h - h.detach().round(), h - h.detach().trunc(),
                 h.amax(-1, keepdim=True).expand_as(h), h.amin(-1, keepdim=True).expand_as(h),
                 torch.logsumexp(h, -1, keepdim=True).expand_as(h), torch.atan2(h, 1 + h * h),
                 torch.flip(h, [-1]), torch.roll(h, 1, -1),
                 h.var(-1, keepdim=True).expand_as(h), h.std(-1, keepdim=True).expand_as(h),
                 h.max(-1, keepdim=True).values.expand_as(h), h.min(-1, keepdim=True).values.expand_as(h),
                 torch.sort(h, -1).values, torch.topk(h, 8, -1).values, torch.remainder(h, 1.5), torch.fmod(h, 1.5)]
        return self.out(torch.stack(parts).mean(0))


@NEWEST
def test_elementwise_and_reducing_functions_train_from_java_like_the_users_model(jvm, tmp_path):
    """The operators their forward and backward emit are on the allow-list, and each runs as eager does."""
    torch.manual_seed(0)
    model = _Elementwise()
    path = export_protocol_3(tmp_path / "m.pt", model, {"name": "adam", "lr": 0.01})
    _java_equals_eager(path, model, ["step"])


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_parameters_without_a_gradient_are_skipped_like_torch_optim(jvm, tmp_path, name):
    model = _Idle()
    optimizer = (torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.1) if name == "adam" else
                 torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01))
    path = export_protocol_3(tmp_path / "m.pt", model, optimizer, clip_grad_norm=0.5)
    program = protocol.read_metadata(path)["program"]
    idle = ["spare.weight", "spare.bias", "scale"]
    assert not set(idle) & set(program["training"]["groups"][0]["params"])
    optimizer_state = [e["name"].split(":") for e in program["state"] if e["name"].startswith("state:")]
    assert (optimizer_state or name == "sgd") and not [n for _, _, n in optimizer_state if n in idle]
    _java_equals_eager(path, model, ["fused", "step"])
    # torch.optim held no state for them either (Adam's step counts are per parameter)
    x, y = mlp_data(0)
    eager = reference.Reference(path, model)
    eager.train_step(x[:BATCH], y[:BATCH])
    assert sorted(n for n, p in eager.named_parameters() if eager.optimizer.state[p]) == sorted(
        n for n, _ in model.named_parameters() if n not in idle)
    if name == "adam":  # and gradbridge-train in a JVM of its own
        np.savez(tmp_path / "train.npz", x=x.numpy(), y=y.numpy())
        run = train_cli("--model", path, "--data", tmp_path / "train.npz", "--batch-size", BATCH, "--seed", 3,
                        "--epochs", 2, "--history", tmp_path / "h.jsonl")
        if not _own_jvm_refused(run):
            expected = reference.train(path, x.numpy(), y.numpy(), epochs=2, batch_size=BATCH, seed=3, model=model)
            assert _records(tmp_path / "h.jsonl") == [(r.epoch, r.loss, r.val_loss, r.digests) for r in expected]


def test_a_one_cycle_checkpoint_resumes_with_its_momentum(jvm, tmp_path):
    model = deep_mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    path = export_protocol_3(tmp_path / "m.pt", model, optimizer, scheduler=_one_cycle(optimizer, "step"))
    x, y = (t.numpy() for t in mlp_data(0))
    settings = dict(batch_size=BATCH, mode="fused", seed=3)
    whole = java.train(path, x, y, epochs=4, **settings)
    first = java.train(path, x, y, epochs=2, checkpoint=tmp_path / "run.pt", **settings)
    counters = protocol.read_metadata(tmp_path / "run.pt")["program"]["counters"]
    fresh = protocol.read_metadata(path)["program"]["counters"]
    assert counters["momenta"] != fresh["momenta"]  # mid-cycle: beta1 moved from the cycle's start
    rest = java.train(tmp_path / "run.pt", x, y, epochs=2, **settings)
    _same(first.records + rest.records, whole)
    _same(whole, reference.train(path, x, y, epochs=4, model=model, **settings))
    # gradbridge-train in a JVM of its own: resumed from its checkpoint, the run never stopped
    np.savez(tmp_path / "train.npz", x=x, y=y)
    cli = ["--data", tmp_path / "train.npz", "--batch-size", BATCH, "--seed", 3, "--mode", "fused"]
    first = train_cli("--model", path, *cli, "--epochs", 2, "--checkpoint", tmp_path / "c.pt",
                      "--history", tmp_path / "first.jsonl")
    if _own_jvm_refused(first):
        return
    rest = train_cli("--resume", tmp_path / "c.pt", *cli, "--epochs", 2, "--history", tmp_path / "rest.jsonl")
    assert rest.returncode == 0, rest.stderr
    assert _records(tmp_path / "first.jsonl") + _records(tmp_path / "rest.jsonl") == [
        (r.epoch, r.loss, r.val_loss, r.digests) for r in whole]


@pytest.mark.parametrize("options, line", [
    (dict(optimizer="rmsprop", scheduler={"name": "onecycle", "max_lr": 0.1, "total_steps": 9, "max_momentum": 0.0}),
     "format='export' does not support OneCycleLR cycling RMSprop's momentum through 0.0 (base_momentum and "
     "max_momentum above 0 are held) yet"),
    (dict(scheduler={"name": "onecycle", "max_lr": 0.1, "total_steps": 9, "base_momentum": 0.0}),
     "format='export' does not support OneCycleLR cycling SGD's momentum through 0.0 (base_momentum and "
     "max_momentum above 0 are held) yet"),
    (dict(batch=1), "format='export' needs an example batch of at least 2 samples, got 1"),
])
def test_what_protocol_3_does_not_hold_is_refused_in_one_line(tmp_path, options, line):
    x, y = mlp_data(0)
    batch = options.pop("batch", BATCH)
    optimizer = options.pop("optimizer", "sgd")
    with pytest.raises(ExportError) as info:
        export_training_module(_mlp(), "cross_entropy", optimizer, tmp_path / "m.pt",
                               example_inputs=(x[:batch], y[:batch]), format="export", **options)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)
    assert not (tmp_path / "m.pt").exists()


def _rewrite(source, target, edit):
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for name in old.namelist():
            data = edit(name, old.read(name))
            if data is not None:
                new.writestr(name, data)
    return target


def _edit_train(change):
    def edit(name, data):
        if name != "graphs/train.json":
            return data
        graph = json.loads(data)
        change(graph)
        return json.dumps(graph)
    return edit


def _unknown_op(graph):
    graph["nodes"][0]["op"] = "aten::no_such_op"


def _version(graph):
    graph["oplist_version"] = 99


def _kind(graph):
    graph["nodes"][0]["args"][0] = {"q": 1}


@pytest.mark.parametrize("edit, words", [
    (_edit_train(_unknown_op), "op list train node 0: operator aten::no_such_op."),
    (_edit_train(_version), f"op list train: op-list version 99, this gradbridge runs version {oplist.VERSION}"),
    (_edit_train(_kind), "unknown argument kind 'q'"),
    (lambda name, data: None if name == "state/0.bin" else data, "the protocol-3 module lacks state/0.bin"),
])
def test_a_bad_protocol_3_file_is_refused_in_one_line(jvm, mlp, tmp_path, edit, words):
    _, path = mlp
    bad = _rewrite(path, tmp_path / "bad.pt", edit)
    with pytest.raises(Exception) as info:
        load_module(bad)
    message = str(info.value.getMessage()) if hasattr(info.value, "getMessage") else str(info.value)
    assert words in message and "\n" not in message


@pytest.fixture(scope="module")
def resumable(tmp_path_factory):
    """AdamW with a per-step warm-up then cosine schedule (SequentialLR), gradient accumulation, BatchNorm and
    dropout: everything a checkpoint keeps (steps, learning rate, the schedules' epochs, the optimizer's
    state, running statistics)."""
    model = deep_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    path = export_protocol_3(tmp_path_factory.mktemp("p3") / "resumable.pt", model, optimizer,
                   scheduler=_scheduler("warmup_cosine", optimizer), accumulate=2)
    return model, path


@NEWEST
def test_a_checkpoint_resumes_bitwise_in_process(jvm, resumable, tmp_path):
    from gradbridge import History

    model, path = resumable
    x, y = (t.numpy() for t in mlp_data(0))
    val = tuple(t.numpy() for t in mlp_data(1))
    settings = dict(batch_size=BATCH, mode="fused", seed=3, val=val)
    checkpoint = tmp_path / "run.pt"
    whole = java.train(path, x, y, epochs=5, **settings)
    first = java.train(path, x, y, epochs=2, checkpoint=checkpoint, **settings)
    rest = java.train(checkpoint, x, y, epochs=3, **settings)
    assert [r.epoch for r in rest] == [2, 3, 4]
    resumed = History(first.records + rest.records)
    _same(resumed, whole)
    assert [r.lrs for r in resumed] == [r.lrs for r in whole]
    eager = reference.train(path, x, y, epochs=5, model=model, **settings)
    _same(whole, eager)
    assert [r.lrs for r in whole] == [r.lrs for r in eager]
    # The checkpoint is a protocol-3 module: its run's record, the counters, the trained state
    metadata = protocol.read_metadata(checkpoint)
    assert metadata["checkpoint"]["epochs_completed"] == 2 and metadata["checkpoint"]["mode"] == "fused"
    counters = metadata["program"]["counters"]
    assert counters["steps"] == 2 * N // BATCH and counters["last_epoch"] == 2 * N // BATCH
    assert counters["children_last_epochs"] == [3, 2 * N // BATCH - 4]  # the warm-up's 3 steps; cosine's since 4
    assert float.fromhex(counters["lrs"][0]) == first[-1].lrs[0]
    _, _, state = read_program(checkpoint)
    assert all(float(state[f"state:step:{n}"]) == 2 * N // BATCH for n, _ in model.named_parameters())
    assert not [name for name in state if name.startswith("grad:")]
    for name, values in first[-1].parameters.items():
        assert np.array_equal(state[f"param:{name}"].double().numpy().ravel(), values), name


def _records(path):
    return [(r["epoch"], r["loss"], r["val_loss"], r["digests"]) for r in map(json.loads, path.read_text().splitlines())]


def _own_jvm_refused(result):
    """gradbridge-train runs the jar's libtorch: a module captured on another torch release is refused in one
    line (then there is nothing more to compare); True when it was."""
    if result.returncode == 0:
        return False
    line = one_error_line(result)
    engine = re.search(r"this JVM runs libtorch (\S+):", line)
    assert engine and _release(engine.group(1)) != _release(torch.__version__), line
    return True


def _cli_run(resumable, tmp_path, epochs):
    """The data files, gradbridge-train's settings, and a run of ``epochs`` never stopped (its records), or
    None when this JVM refuses the module (another torch release)."""
    _, path = resumable
    x, y = mlp_data(0)
    vx, vy = mlp_data(1)
    np.savez(tmp_path / "train.npz", x=x.numpy(), y=y.numpy())
    np.savez(tmp_path / "val.npz", x=vx.numpy(), y=vy.numpy())
    settings = ["--data", tmp_path / "train.npz", "--val", tmp_path / "val.npz", "--batch-size", BATCH, "--seed", 3]
    whole = train_cli("--model", path, *settings, "--epochs", epochs, "--history", tmp_path / "whole.jsonl")
    return settings, None if _own_jvm_refused(whole) else _records(tmp_path / "whole.jsonl")


def _eager_records(resumable, epochs):
    model, path = resumable
    x, y = mlp_data(0)
    vx, vy = mlp_data(1)
    eager = reference.train(path, x.numpy(), y.numpy(), epochs=epochs, batch_size=BATCH, seed=3, model=model,
                            val=(vx.numpy(), vy.numpy()))
    return [(r.epoch, r.loss, r.val_loss, r.digests) for r in eager]


def test_a_run_resumed_in_a_jvm_of_its_own_equals_the_run_never_stopped(resumable, tmp_path):
    settings, expected = _cli_run(resumable, tmp_path, 5)
    if expected is None:
        return
    checkpoint = tmp_path / "c.pt"
    first = train_cli("--model", resumable[1], *settings, "--epochs", 2, "--checkpoint", checkpoint,
                      "--history", tmp_path / "first.jsonl")
    assert first.returncode == 0, first.stderr
    rest = train_cli("--resume", checkpoint, *settings, "--epochs", 3, "--checkpoint", tmp_path / "end.pt",
                     "--history", tmp_path / "rest.jsonl")
    assert rest.returncode == 0, rest.stderr
    assert _records(tmp_path / "first.jsonl") + _records(tmp_path / "rest.jsonl") == expected
    assert expected == _eager_records(resumable, 5)
    assert protocol.read_metadata(tmp_path / "end.pt")["checkpoint"]["epochs_completed"] == 5


@pytest.mark.slow
def test_a_killed_run_resumed_in_a_jvm_of_its_own_equals_the_run_never_killed(resumable, tmp_path):
    epochs, checkpoint, history = 200, tmp_path / "c.pt", tmp_path / "h.jsonl"
    settings, expected = _cli_run(resumable, tmp_path, epochs)
    if expected is None:
        return
    path = resumable[1]
    process = subprocess.Popen([str(TRAIN_SCRIPT), *map(str, ["--model", path, *settings, "--epochs", epochs,
                                                              "--checkpoint", checkpoint, "--history", history])],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not history.exists():
        assert process.poll() is None, process.communicate()
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    done = protocol.read_metadata(checkpoint)["checkpoint"]["epochs_completed"]
    assert 0 < done < epochs
    rest = train_cli("--resume", checkpoint, *settings, "--epochs", epochs - done, "--history", tmp_path / "rest.jsonl")
    assert rest.returncode == 0, rest.stderr
    kept = _records(history)
    assert kept == expected[:len(kept)] and len(kept) <= done
    assert _records(tmp_path / "rest.jsonl") == expected[done:]
    assert expected == _eager_records(resumable, epochs)


def test_a_snapshot_is_the_module_as_it_is_now(jvm, resumable, tmp_path):
    _, path = resumable
    x, y = mlp_data(0)
    module = load_module(path)
    try:
        with jvm.java_errors():
            module.trainStep(jvm.to_tensor(x[:BATCH].numpy()), jvm.to_tensor(y[:BATCH].numpy()))
            assert module.stateFinite()
            access = jvm.jclass("dev.gradbridge.internal.ModuleAccess")  # library-internal calls, no API
            snapshot = access.snapshot(module).get()
            try:
                saved = bytes(access.checkpointArchive(module, None))
                assert bytes(access.checkpointArchive(snapshot, None)) == saved
                # the copy trains on by itself: the module it came from stays as it was
                snapshot.trainStep(jvm.to_tensor(x[BATCH:2 * BATCH].numpy()), jvm.to_tensor(y[BATCH:2 * BATCH].numpy()))
                assert bytes(access.checkpointArchive(module, None)) == saved
                assert bytes(access.checkpointArchive(snapshot, None)) != saved
            finally:
                snapshot.close()
    finally:
        module.close()


def _online(model_path, log_dir, batch):
    import jpype

    OnlineLearner = jpype.JClass("dev.gradbridge.online.OnlineLearner")
    Paths = jpype.JClass("java.nio.file.Paths")
    return (OnlineLearner.builder().optMaxBatch(batch).optMaxWaitMillis(0).optPublishEvery(2).optCheckpointEvery(2)
            .optPredictors(2).open(Paths.get(str(model_path)), Paths.get(str(log_dir))))


def test_the_online_learner_trains_predicts_and_resumes_like_eager_replay(jvm, tmp_path):
    """A model TorchScript cannot script, served and trained online from protocol 3: micro-batches of 1 to 4
    events (one sample runs the graphs captured at one), predictions of 1 and 3 rows equal to eager's forward
    on the version they report, a restart from the learner's checkpoint and log; `gradbridge replay` with the
    user's model factory bit for bit."""
    import jpype

    from gradbridge.commands.main import main as cli_main
    from gradbridge.replay import replay
    from tests.models import custom

    TimeUnit = jpype.JClass("java.util.concurrent.TimeUnit")
    torch.manual_seed(0)
    model = custom.unscriptable()
    x, y = mlp_data(0)
    path = export_training_module(model, "cross_entropy", torch.optim.Adam(model.parameters(), lr=1e-2),
                                  tmp_path / "m.pt", example_inputs=(x[:BATCH], y[:BATCH]), format="export")
    entry = protocol.read_metadata(path)[protocol.PROGRAM_KEY]
    assert entry["min_batch"] == 1 and {"train@1", "forward@1", "loss@1"} <= set(entry["graphs"])
    xs, ys = x.numpy(), y.numpy()
    log_dir, at, predictions = tmp_path / "log", 0, []
    for sizes in ([1, 3, 4, 1, 2], [1, 4, 2]):  # a second learner resumes from the first's checkpoint and log
        learner = _online(path, log_dir, batch=4)
        try:
            for size in sizes:  # each call its own micro-batch (no wait)
                learner.learn(host_tensor(xs[at:at + size]), host_tensor(ys[at:at + size]))
                assert learner.awaitIdle(10, TimeUnit.SECONDS)
                at += size
                for rows in (1, 3):
                    p = learner.predict(host_tensor(xs[:rows]))
                    predictions.append((int(p.getVersion()), rows, bytes(p.getOutput().toBytes())))
        finally:
            learner.close()
    report = replay(log_dir, path, custom.unscriptable(), keep_parameters=True)
    assert report.bitwise, report.table()
    assert report.batches == 8 and report.events == at == 18
    eager = custom.unscriptable().eval()
    for version, rows, got in predictions:
        with torch.no_grad():
            for name, p in eager.named_parameters():
                p.copy_(report.parameters[version][name])
            assert got == eager(x[:rows]).numpy().astype("<f4").tobytes(), (version, rows)
    assert cli_main(["replay", "--log", str(log_dir), "--model", str(path), "--model-factory",
                     "tests.models.custom:unscriptable"]) == 0


def test_gradcheck_checks_a_protocol_3_module_with_the_users_model(jvm, tmp_path):
    """Java's gradients against the op lists run by the interpreter's Python twin and against the user's eager
    autograd (dropout on, one seed), bit for bit; finite differences on the user's model in float64; the CLI
    needs --model-factory for a protocol-3 module (one line without it)."""
    from gradbridge import gradcheck, models
    from gradbridge.commands.main import main as cli_main
    from gradbridge.reference import Reference

    torch.manual_seed(0)
    model = models.mlp(dropout=0.2)
    x, y = mlp_data(0)
    path = export_training_module(model, "cross_entropy", torch.optim.SGD(model.parameters(), lr=0.1),
                                  tmp_path / "m.pt", example_inputs=(x[:BATCH], y[:BATCH]), format="export")
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=y.numpy())
    result = gradcheck.check(path, tmp_path / "d.npz", user_model=model)
    assert result.ok and not result.differing and len(result.checks) == 6, result
    java = gradcheck.java_gradients(path, x[:8].numpy(), y[:8].numpy())
    eager = Reference(path, model)
    torch.manual_seed(gradcheck.SEED)
    eager.loss(eager.model(x[:8]), y[:8]).backward()
    for name, p in eager.model.named_parameters():
        assert np.array_equal(java[name].ravel(), p.grad.double().numpy().ravel()), name

    plain = tmp_path / "plain.pt"
    torch.manual_seed(0)
    model = models.mlp()
    export_training_module(model, "cross_entropy", torch.optim.SGD(model.parameters(), lr=0.1), plain,
                           example_inputs=(x[:BATCH], y[:BATCH]), format="export")
    assert cli_main(["gradcheck", str(plain), "--data", str(tmp_path / "d.npz"), "--model-factory",
                     "gradbridge.models:mlp"]) == 0
    result = subprocess.run([sys.executable, "-m", "gradbridge", "gradcheck", str(plain), "--data",
                             str(tmp_path / "d.npz")], capture_output=True, text=True)
    assert one_error_line(result, "gradbridge: error: ") == messages.protocol3_needs_model(str(plain))


def _java_flags(values):
    import jpype

    return jpype.JClass("dev.gradbridge.Tensor").of(jpype.JArray(jpype.JBoolean)(values),
                                                   jpype.JArray(jpype.JLong)([len(values)]))


def test_set_gradients_checks_its_arguments_as_the_torchscript_method(jvm, tmp_path):
    """Spark's combined gradients go in through set_gradients: a wrong count, shape or dtype, or a gradient for
    a frozen parameter, is refused naming it and changes nothing; gradient_flags reports what it set."""
    import jpype

    torch.manual_seed(0)
    model = _mlp()
    model[0].weight.requires_grad_(False)
    x, y = mlp_data(0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    path = export_training_module(model, "cross_entropy", torch.optim.SGD(trainable, lr=0.1),
                                  tmp_path / "frozen.pt", example_inputs=(x[:BATCH], y[:BATCH]), format="export")
    module = load_module(path)
    try:
        with jvm.java_errors():
            shapes = [p.shape for p in model.parameters()]
            grads = jpype.JClass("java.util.ArrayList")()
            for shape in shapes:
                grads.add(jvm.to_tensor(np.ones(shape, dtype=np.float32)))
            flags = _java_flags([False, True, True, True])
            module.call("set_gradients", grads, flags)
            assert list(module.call("gradient_flags").toBooleanArray()) == [False, True, True, True]
            assert np.array_equal(module.getGradients()["3.bias"], np.ones(3))
            assert np.array_equal(module.getGradients()["0.weight"], np.zeros(32))
        refusals = [
            (grads.subList(0, 3), flags, "expected 4 tensors and 4 flags, got 3 and 4"),
            (grads, _java_flags([True] * 4), "0.weight is frozen and cannot hold a gradient"),
        ]
        doubles = jpype.JClass("java.util.ArrayList")(grads)
        doubles.set(1, jvm.to_tensor(np.ones(shapes[1], dtype=np.float64)))
        refusals.append((doubles, flags, "0.bias must have shape [8] and dtype float32"))
        for values, given, reason in refusals:
            with pytest.raises(Exception) as info:
                module.call("set_gradients", values, given)
            assert str(info.value.getMessage()) == f"{path}: set_gradients() failed: set_gradients: {reason}"
        assert list(module.call("gradient_flags").toBooleanArray()) == [False, True, True, True]
    finally:
        module.close()


def _set_parameters(jvm, module, parameters):
    tensors = jvm.jclass("java.util.ArrayList")()
    for name in module.call("parameter_names"):
        tensors.add(jvm.to_tensor(parameters[str(name)].numpy()))
    module.call("set_parameters", tensors)


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_a_torch_optim_state_loads_and_trains_on_like_torch_optim(jvm, tmp_path, name):
    # Given torch.optim's state after two steps of the user's eager model (Adam: its step counts too)
    model = deep_mlp()
    optimizer = (torch.optim.Adam(model.parameters(), lr=0.01, amsgrad=True, weight_decay=0.1) if name == "adam" else
                 torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, dampening=0.2))
    path = export_protocol_3(tmp_path / "m.pt", model, optimizer)
    x, y = mlp_data(0)
    batches = [(x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]) for k in range(3)]
    eager = reference.Reference(path, model)
    for k in (0, 1):
        torch.manual_seed(k)
        eager.train_step(*batches[k])
    module = load_module(path)
    try:
        with jvm.java_errors():
            # When a fresh protocol-3 module takes its parameters and torch.optim's state
            _set_parameters(jvm, module, eager.parameters())
            module.call("load_optimizer_state", java_state(jvm, torch_layout(eager.optimizer)))
            # Then it trains on as torch.optim does
            for k in (2, 0):
                torch.manual_seed(k)
                expected = eager.train_step(*batches[k])
                torch.manual_seed(k)
                actual = module.call("train_step", jvm.to_tensor(batches[k][0].numpy()), jvm.to_tensor(batches[k][1].numpy()))
                assert list(actual.toExactDoubles()) == [float(expected)]
            held = module.call("optimizer_state")
            torch_state = torch_layout(eager.optimizer)
            assert sorted(str(k) for k in held.keySet()) == sorted(torch_state)
            for key, values in torch_state.items():
                for a, e in zip(tensor_values(held.get(key)), values):
                    assert np.array_equal(a, e.double().numpy().ravel()), key
            for a, (n, e) in zip(tensor_values(module.call("get_parameters")), eager.parameters().items()):
                assert np.array_equal(a, e.double().numpy().ravel()), n
    finally:
        module.close()


def test_a_state_without_momentum_buffers_makes_the_next_sgd_step_create_them(jvm, tmp_path):
    # Given a module that stepped (its buffers held) and torch.optim's state before any step (no buffers)
    model = deep_mlp()
    path = export_protocol_3(tmp_path / "m.pt", model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                                               dampening=0.5))
    x, y = mlp_data(0)
    eager = reference.Reference(path, model)
    initial = eager.parameters()
    module = load_module(path)
    try:
        with jvm.java_errors():
            for _ in range(2):
                module.call("train_step", jvm.to_tensor(x[:BATCH].numpy()), jvm.to_tensor(y[:BATCH].numpy()))
            assert set(str(k) for k in module.call("optimizer_state").keySet()) == {"momentum_buffer"}
            # When it loads that state: no buffers (torch's momentum_buffer is None again)
            _set_parameters(jvm, module, initial)
            module.call("load_optimizer_state", java_state(jvm, torch_layout(eager.optimizer)))
            assert module.call("optimizer_state").isEmpty()
            # Then its next step copies the gradient into new buffers, as torch's first step does (no dampening)
            for k in range(3):
                torch.manual_seed(k)
                expected = eager.train_step(x[:BATCH], y[:BATCH])
                torch.manual_seed(k)
                actual = module.call("train_step", jvm.to_tensor(x[:BATCH].numpy()), jvm.to_tensor(y[:BATCH].numpy()))
                assert list(actual.toExactDoubles()) == [float(expected)]
    finally:
        module.close()


def test_python_tools_that_read_torchscript_refuse_a_protocol_3_module_in_one_line(mlp):
    from gradbridge._runtime import torchscript
    from gradbridge.errors import ProtocolError

    _, path = mlp
    with pytest.raises(ProtocolError) as info:
        torchscript.load(str(path))
    assert "a protocol-3 module (format='export') is not TorchScript" in str(info.value)
    with pytest.raises(ProtocolError, match="a protocol-3 module .* holds no Python model: pass model="):
        reference.Reference(path)
