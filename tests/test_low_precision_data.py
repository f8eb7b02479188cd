"""bfloat16 and float16 *inputs*, and mixed precision without editing the model, bit for bit against eager:

- data carries a 16-bit input as float32 holding exactly its values (``protocol.CARRIER``; numpy and Parquet have
  no bfloat16): .npz through ``gradbridge-train``, ``java.train``, ``reference.train`` and ``gradbridge parity``,
  Parquet and .npz through gradbridge-spark, float32 features through the online learner and ``gradbridge serve``;
  a value the cast would round is refused in one line, the same line from each;
- ``export_training_module(..., autocast=torch.bfloat16)``: forward and loss under ``torch.autocast("cpu")`` as
  the user's own eager loop runs them, in both formats;
- models whose dtypes mix (a bf16 body, a float32 head or embeddings).

The default run holds one case of each (TorchScript); ``--full`` adds protocol 3, float16, a bf16 target, named
inputs, the parity command, the service over HTTP and Spark.
"""

from __future__ import annotations

import copy
import json
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradbridge import History, compare_histories, export_training_module, java, protocol, reference
from gradbridge import online, replay as replay_mod
from gradbridge._runtime.devtree import root
from gradbridge.errors import InvalidInputError

from .online_support import host_tensor, open_learner

CLI = root() / "build" / "install" / "gradbridge" / "bin" / "gradbridge-train"
#: float32, and not a bfloat16 value (nor a float16 one: 1 + 2^-8 needs 8 mantissa bits, bfloat16 has 7)
INEXACT = 1.00390625


def _cli(*args) -> subprocess.CompletedProcess:
    """gradbridge-train (a JVM of its own)."""
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True)


def _cli_runs_this_torch() -> bool:
    """Whether gradbridge-train's JVM runs this Python's torch release (the checkout's runs the jar's, the oldest)."""
    import re

    from gradbridge._runtime import classpath

    jars = [m.group(1) for e in classpath.resolve().entries for m in [re.search(r"pytorch-native-\w+-(\d+\.\d+\.\d+)", e)]
            if m]
    return not jars or jars[0] == torch.__version__.split("+")[0]


def _refusal(source, name: str, index, dtype: str = "bfloat16", value=INEXACT) -> str:
    """The line for a carried value that ``dtype`` does not hold (``source`` "": a request's, without one)."""
    where = f"{source}: " if source else ""
    return (f"{where}{name}{list(index)} = {value} is not a {dtype} value; gradbridge casts float32 data to the "
            f"model's {dtype} without rounding: round it first (torch.from_numpy(a).to(torch.{dtype}).float())")


class MixedNet(nn.Module):
    """A bfloat16 body taking a bfloat16 input, a float32 head: no cast of the input in forward."""

    def __init__(self, features=6, dtype=torch.bfloat16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU()).to(dtype)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.body(x).float())


class Plain(nn.Module):
    """float32 throughout: ``autocast=`` makes it mixed precision."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.body(x))


def _data(n=40, dtype=torch.bfloat16, features=6):
    """x of ``dtype`` values (a tensor) and its float32 carrier (an array), int64 labels."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g).to(dtype)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x, x.float().numpy(), y


def _export(model, x, y, path, fmt, **options):
    return export_training_module(model, "cross_entropy", torch.optim.AdamW(model.parameters(), lr=0.01), path,
                                  example_inputs=(x[:8], y[:8]), format=fmt, **options)


def _bfloat16_inputs(jvm, tmp_path, fmt):
    torch.manual_seed(0)
    model = MixedNet()
    x, carrier, y = _data()
    path = _export(model, x, y, tmp_path / "m.pt", fmt)
    assert [s["dtype"] for s in protocol.read_metadata(path)["inputs"]] == ["bfloat16", "int64"]
    np.savez(tmp_path / "train.npz", x=carrier, y=y.numpy())
    settings = dict(epochs=2, batch_size=6, seed=3)
    eager = reference.train(path, carrier, y.numpy(), model=model, **settings)
    assert compare_histories(eager, java.train(path, carrier, y.numpy(), **settings)).bitwise
    if fmt == "export" and not _cli_runs_this_torch():
        return path, model, carrier, y  # protocol 3 runs on the torch release it was captured with
    result = _cli("--model", path, "--data", tmp_path / "train.npz", "--epochs", 2, "--batch-size", 6, "--seed", 3,
                  "--history", tmp_path / "h.jsonl")
    assert result.returncode == 0, result.stderr
    assert compare_histories(eager, History.load(tmp_path / "h.jsonl")).bitwise
    return path, model, carrier, y


def test_bfloat16_inputs_from_an_npz_train_bitwise_and_an_inexact_value_is_one_line(jvm, tmp_path):
    """A bf16 body (float32 head) on bf16 inputs: the .npz carries them as float32; gradbridge-train, java.train and
    reference.train with the user's nn.Module agree bit for bit. A float32 value that is not a bfloat16 one is the
    same line from the CLI, java.train and reference.train, and nothing trains."""
    path, model, carrier, y = _bfloat16_inputs(jvm, tmp_path, "torchscript")
    bad = carrier.copy()
    bad[3, 1] = INEXACT
    np.savez(tmp_path / "bad.npz", x=bad, y=y.numpy())
    result = _cli("--model", path, "--data", tmp_path / "bad.npz", "--history", tmp_path / "bad.jsonl")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: " + _refusal(tmp_path / "bad.npz", "x", [3, 1])
    assert not (tmp_path / "bad.jsonl").exists()
    for train in (java.train, lambda *a, **k: reference.train(*a, model=model, **k)):
        with pytest.raises(InvalidInputError) as error:
            train(path, bad, y.numpy(), epochs=1, source="bad.npz")
        assert str(error.value) == _refusal("bad.npz", "x", [3, 1])
    # an array of another dtype names the carrier
    with pytest.raises(InvalidInputError, match=r"x must be bfloat16 \(as float32\) of shape \[-1, 6\] .*got float64"):
        java.train(path, carrier.astype(np.float64), y.numpy(), epochs=1)


@pytest.mark.slow
def test_bfloat16_inputs_in_protocol_3(jvm, tmp_path):
    _bfloat16_inputs(jvm, tmp_path, "export")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_float16_inputs_from_float16_or_float32_arrays(jvm, tmp_path, fmt):
    """float16 has numpy's dtype: its arrays as they are, or float32 ones holding float16 values."""
    torch.manual_seed(0)
    model = MixedNet(dtype=torch.float16)
    x, carrier, y = _data(dtype=torch.float16)
    try:
        model(x[:2]).sum().backward()
    except RuntimeError as ex:  # an older torch without float16 CPU kernels for these ops
        pytest.skip(f"torch {torch.__version__} has no float16 CPU kernel here: {ex}")
    model.zero_grad(set_to_none=True)
    path = export_training_module(model, "cross_entropy", torch.optim.SGD(model.parameters(), lr=0.05),
                                  tmp_path / "m.pt", example_inputs=(x[:8], y[:8]), format=fmt)
    eager = reference.train(path, carrier, y.numpy(), epochs=2, batch_size=8, model=model)
    for given in (carrier, x.numpy()):
        assert compare_histories(eager, java.train(path, given, y.numpy(), epochs=2, batch_size=8)).bitwise
    bad = carrier.copy()
    bad[0, 2] = 70000.0  # past float16's range
    with pytest.raises(InvalidInputError, match=r"x\[0, 2\] = 70000.0 is not a float16 value"):
        java.train(path, bad, y.numpy(), epochs=1)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(x)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_a_bfloat16_target_and_model_with_mse(jvm, tmp_path, fmt):
    """y may be bfloat16 too (mse on a bf16 output), carried as float32 like an input."""
    torch.manual_seed(0)
    model = Regressor().to(torch.bfloat16)
    x, carrier, _ = _data(features=4)
    y = (x.float() @ torch.tensor([[1.0], [-2.0], [0.5], [0.25]])).to(torch.bfloat16)
    path = export_training_module(model, "mse", torch.optim.SGD(model.parameters(), lr=0.05), tmp_path / "m.pt",
                                  example_inputs=(x[:8], y[:8]), format=fmt)
    assert protocol.read_metadata(path)["inputs"][-1]["dtype"] == "bfloat16"
    y32 = y.float().numpy()
    eager = reference.train(path, carrier, y32, epochs=2, batch_size=8, model=model)
    assert compare_histories(eager, java.train(path, carrier, y32, epochs=2, batch_size=8)).bitwise


class Recommender(nn.Module):
    """Named inputs whose dtypes mix: int64 ids into float32 embeddings, a bfloat16 context into a bfloat16 head;
    its output float32, or (``out``) bfloat16."""

    def __init__(self, out=torch.float32):
        super().__init__()
        self.users = nn.Embedding(10, 4)
        self.head = nn.Sequential(nn.Linear(4 + 3, 8), nn.ReLU(), nn.Linear(8, 1)).to(torch.bfloat16)
        self.out = out

    def forward(self, user, context):
        return self.head(torch.cat([self.users(user).to(torch.bfloat16), context], 1)).to(self.out)


def _recommender(tmp_path, n=60, fmt="auto", out=torch.float32):
    """The recommender exported with AdamW and mse (a target of its output's dtype), its data as arrays (float32
    carrying the bfloat16 ones)."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = Recommender(out)
    x = {"user": torch.randint(0, 10, (n,), generator=g), "context": torch.randn(n, 3, generator=g).to(torch.bfloat16)}
    y = torch.randn(n, 1, generator=g).to(out)
    path = export_training_module(model, "mse", torch.optim.AdamW(model.parameters(), lr=0.01), tmp_path / "r.pt",
                                  example_inputs=({k: v[:8] for k, v in x.items()}, y[:8]), format=fmt)
    arrays = {"user": x["user"].numpy(), "context": x["context"].float().numpy()}
    return model, path, arrays, y.float().numpy()


@pytest.mark.slow
def test_named_bfloat16_inputs_and_the_parity_command(jvm, tmp_path):
    """Several inputs, one of them bf16, through ``gradbridge parity`` (in process) on an .npz."""
    from gradbridge.commands import parity as paritycheck

    model, path, x, y = _recommender(tmp_path, fmt="torchscript")
    np.savez(tmp_path / "r.npz", **x, y=y)
    lines = []
    assert paritycheck.run(path, tmp_path / "r.npz", epochs=2, batch_size=16, out=lines.append) == 0, lines
    assert any("bitwise identical over 2 epochs" in line for line in lines), lines
    eager = reference.train(path, x, y, epochs=2, batch_size=16, model=model)
    assert compare_histories(eager, java.train(path, x, y, epochs=2, batch_size=16)).bitwise


# ---- autocast= ----

def _autocast(jvm, tmp_path, fmt, dtype=torch.bfloat16, loss="cross_entropy"):
    """The user's eager loop: forward and loss under torch.autocast("cpu"), backward and AdamW outside it."""
    torch.manual_seed(0)
    model = Plain()
    x, _, y = _data(dtype=torch.float32)
    path = export_training_module(model, loss, torch.optim.AdamW(model.parameters(), lr=0.01), tmp_path / "a.pt",
                                  example_inputs=(x[:8], y[:8]), format=fmt, autocast=dtype)
    assert protocol.read_metadata(path)[protocol.CAPTURE_KEY][protocol.AUTOCAST_KEY] == protocol.dtype_name(dtype)
    mine = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(mine.parameters(), lr=0.01)
    losses = []
    for _ in range(3):  # mode="full": one step on all the data per epoch
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss_value = F.cross_entropy(mine(x), y)
        loss_value.backward()
        optimizer.step()
        losses.append(loss_value.item())
    in_java = java.train(path, x.numpy(), y.numpy(), epochs=3, mode="full")
    assert [r.loss for r in in_java] == losses
    for name, p in mine.named_parameters():
        assert np.array_equal(in_java[-1].parameters[name], p.detach().double().numpy().ravel()), name
    # batches of another size than the example's (6, and a last one of 4), as the reference trains them
    settings = dict(epochs=2, batch_size=6, seed=1)
    in_java = java.train(path, x.numpy(), y.numpy(), **settings)
    assert compare_histories(reference.train(path, x.numpy(), y.numpy(), model=model, **settings), in_java).bitwise
    if fmt == "torchscript":  # the model stored in the .pt (gradbridge parity without --model-factory): its casts
        assert compare_histories(reference.train(path, x.numpy(), y.numpy(), **settings), in_java).bitwise
    return model, path


def test_autocast_export_trains_as_eager_code_under_autocast(jvm, tmp_path):
    """``autocast=torch.bfloat16`` on a float32 model: the losses and parameters of the user's own loop under
    ``torch.autocast("cpu", dtype=torch.bfloat16)``, bit for bit; a dtype CPU autocast does not take is one line."""
    _autocast(jvm, tmp_path, "torchscript")
    for refused in (torch.float32, "bfloat16"):
        with pytest.raises(ValueError) as error:
            export_training_module(Plain(), "cross_entropy", {"name": "sgd"}, tmp_path / "no.pt",
                                   example_inputs=(torch.randn(4, 6), torch.zeros(4).long()), autocast=refused)
        assert str(error.value) == (f"autocast must be a dtype torch.autocast(\"cpu\", ...) takes (torch.bfloat16 or "
                                    f"torch.float16), got {refused!r}")
    assert not (tmp_path / "no.pt").exists()


@pytest.mark.slow
def test_autocast_export_in_protocol_3(jvm, tmp_path):
    _autocast(jvm, tmp_path, "export")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_autocast_float16(jvm, tmp_path, fmt):
    _autocast(jvm, tmp_path, fmt, dtype=torch.float16)


class InsideAutocast(Plain):
    """Its own autocast region in forward (TorchScript scripts it, and its script runs without the region)."""

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.head(self.body(x))


@pytest.mark.slow
def test_a_forward_under_autocast_inside_the_model_still_exports_bitwise(jvm, tmp_path):
    """No option: the model's own autocast region. TorchScript's script drops it (the check refuses), so
    format="auto" takes protocol 3, bit for bit."""
    torch.manual_seed(0)
    model = InsideAutocast()
    x, _, y = _data(dtype=torch.float32)
    path = _export(model, x, y, tmp_path / "m.pt", "auto")
    assert protocol.read_metadata(path)[protocol.CAPTURE_KEY]["kind"] == "export"
    settings = dict(epochs=2, batch_size=6)
    assert compare_histories(reference.train(path, x.numpy(), y.numpy(), model=model, **settings),
                             java.train(path, x.numpy(), y.numpy(), **settings)).bitwise


# ---- the online learner, gradbridge serve, gradbridge-spark ----

def test_online_learner_takes_bfloat16_features_as_float32_and_replays_bitwise(jvm, tmp_path):
    """A bf16 model learning online (in process): float32 features holding bfloat16 values are cast as the module's
    metadata says, logged as bfloat16 words, predicted, and replayed bit for bit with the user's nn.Module; a value
    that is not a bfloat16 one is refused in one line and not logged. The same numbers as Java's 16-bit helpers:
    ``DType.round``, ``widen`` and ``holds`` against torch's casts."""
    import jpype

    DType = jpype.JClass("dev.gradbridge.DType")
    values = np.random.default_rng(0).standard_normal(500).astype(np.float32) * np.float32(1e3)
    for name, dtype in (("BFLOAT16", torch.bfloat16), ("FLOAT16", torch.float16)):
        kind = getattr(DType, name)
        words = torch.from_numpy(values).to(dtype).view(torch.int16).numpy()
        assert [int(kind.round(float(v))) for v in values] == words.tolist()
        widened = torch.from_numpy(words).view(dtype).float().numpy()
        assert [float(kind.widen(int(w))) for w in words] == widened.tolist()
        assert [bool(kind.holds(float(v))) for v in values] == (widened == values).tolist()

    torch.manual_seed(0)
    model = MixedNet(features=4)
    x, carrier, y = _data(n=48, features=4)
    path = _export(model, x, y, tmp_path / "m.pt", "torchscript")
    learner = open_learner(path, tmp_path / "log")
    try:
        for start in range(0, 48, 8):
            learner.learn(host_tensor(carrier[start:start + 8]), host_tensor(y.numpy()[start:start + 8]))
        bad = carrier[:2].copy()
        bad[1, 2] = INEXACT
        with pytest.raises(jpype.JClass("dev.gradbridge.InvalidInputException")) as error:
            learner.learn(host_tensor(bad), host_tensor(y.numpy()[:2]))
        assert str(error.value.getMessage()) == _refusal("", "x", [1, 2])
        assert learner.awaitIdle(30, jpype.JClass("java.util.concurrent.TimeUnit").SECONDS)
        prediction = learner.predict(host_tensor(carrier[:2]))
        assert str(prediction.getOutput().getDtype()) == "float32"
    finally:
        learner.close()
    report = replay_mod.replay(tmp_path / "log", path, model=model)
    assert report.bitwise, report.table()
    assert report.events == 48
    words = torch.tensor([1.0, -2.5, 3.0e38], dtype=torch.bfloat16)
    held = jpype.JClass("dev.gradbridge.online.HostTensor").of("bfloat16", jpype.JArray(jpype.JLong)([3]),
                                                                 jpype.JArray(jpype.JByte)(words.view(torch.int16).numpy().tobytes()))
    assert online.to_numpy(held).tolist() == words.float().tolist()  # numpy has no bfloat16: widened exactly


@pytest.mark.slow
def test_serve_over_http_takes_bfloat16_features(serve_script, tmp_path):
    """gradbridge-serve (a JVM of its own) on the mixed recommender of a bf16 output and target: JSON numbers for
    the bf16 context and y, the bf16 prediction written as numbers, one 400 line for a value that is not a bfloat16
    one; the log replays bit for bit."""
    from .serving import Service

    model, path, x, y = _recommender(tmp_path, fmt="torchscript", out=torch.bfloat16)
    with Service(serve_script, path, tmp_path / "log", "--max-batch", 4, "--publish-every", 1, "--seed", 5) as service:
        for start in range(0, 40, 4):
            body = {"x": {name: a[start:start + 4].tolist() for name, a in x.items()}, "y": y[start:start + 4].tolist()}
            status, text = service.post("/feedback", body)
            assert status == 200, text
        status, text = service.post("/predict", {"x": {name: a[:2].tolist() for name, a in x.items()}})
        assert status == 200, text
        predicted = np.array(json.loads(text)["y"], dtype=np.float32)
        assert predicted.shape == (2, 1) and np.array_equal(torch.from_numpy(predicted).to(torch.bfloat16).float(),
                                                            predicted)  # bfloat16 values
        bad = {"user": [1], "context": [[0.1, 0.0, 0.0]]}
        status, text = service.post("/feedback", {"x": bad, "y": [[0.0]]})
        assert status == 400 and text.strip() == "error: " + _refusal("", "x.context", [0, 0], value=0.10000000149011612)
        assert service.terminate()[0] == 0
    report = replay_mod.replay(tmp_path / "log", path, model=model)
    assert report.bitwise, report.table()
    assert report.events == 40


@pytest.mark.slow
def test_spark_trains_a_mixed_bfloat16_model_on_parquet_and_npz(tmp_path):
    """gradbridge-spark K=2 on the recommender (bf16 head, float32 embeddings, a bf16 context column of floats):
    bf16 gradients combined as torch rounds them, bit for bit against the replay on the user's nn.Module, from
    Parquet and from .npz; the checkpoint names the data as the shards hold it; an inexact value is one line."""
    from gradbridge._runtime import sparkrun

    from .spark_support import assert_bitwise, spark_train

    model, path, x, y = _recommender(tmp_path)
    np.savez(tmp_path / "r.npz", **x, y=y)
    bad = {**x, "context": x["context"].copy()}
    bad["context"][5, 1] = INEXACT
    np.savez(tmp_path / "bad.npz", **bad, y=y)
    sparkrun.to_parquet([(tmp_path / "r.npz", tmp_path / "r.parquet"), (tmp_path / "bad.npz", tmp_path / "bad.parquet")])
    replay = reference.train_sharded(path, x, y, epochs=2, shards=2, batch_size=16, model=model)
    for data in ("r.parquet", "r.npz"):
        history, checkpoint = tmp_path / f"{data}.jsonl", tmp_path / f"{data}.pt"
        spark_train("--model", path, "--data", tmp_path / data, "--epochs", 2, "--batch-size", 16, "--history", history,
                    "--checkpoint", checkpoint, master="local[2]")
        assert_bitwise(History.load(history), replay)
        saved = protocol.read_metadata(checkpoint)["checkpoint"]
        assert saved["shards_sha256"] == reference.shards_sha256(x, y, 2, protocol.read_metadata(path))
    lines = {}
    for data in ("bad.npz", "bad.parquet"):
        result = sparkrun.run(["--master", "local[2]", "--model", str(path), "--data", str(tmp_path / data),
                               "--epochs", "1"], check=False)
        assert result.returncode == 1
        lines[data] = result.stderr.strip().splitlines()[-1]
    assert lines["bad.npz"] == "error: " + _refusal(tmp_path / "bad.npz", "context", [5, 1])
    assert lines["bad.parquet"] == (f"error: {tmp_path / 'bad.parquet'}: column context holds values that are not "
                                    "bfloat16 in 1 rows; gradbridge casts float32 data to the model's bfloat16 without "
                                    "rounding: round it first (torch.from_numpy(a).to(torch.bfloat16).float())")
