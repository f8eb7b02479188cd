"""Models of several inputs (gradbridge._runtime.inputs): exported with their names, dtypes and shapes, trained from
Java (in this process, in a JVM of its own, through TrainingModule's named calls) bit for bit like the
user's eager nn.Module; every wrong input refused in one line naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from gradbridge._runtime import data, launcher
from gradbridge import export_training_module, java, messages, protocol, reference
from gradbridge.errors import InvalidInputError
from gradbridge.jvm import jclass, load_module, to_tensor
from gradbridge.parity import SEPARATE_JVM_ATOL, SEPARATE_JVM_RTOL, assert_histories_match

pytestmark = pytest.mark.every_torch_java

N, BATCH = 24, 8


class Recommender(nn.Module):
    """User and item ids and context features, as three tensors: a scripted model of several inputs."""

    def __init__(self):
        super().__init__()
        self.users = nn.Embedding(10, 4)
        self.items = nn.Embedding(20, 4)
        self.head = nn.Sequential(nn.Linear(8 + 3, 8), nn.ReLU(), nn.Dropout(0.25), nn.Linear(8, 1))

    def forward(self, user: Tensor, item: Tensor, context: Tensor) -> Tensor:
        return self.head(torch.cat([self.users(user), self.items(item), context], 1))


class MaskedTokens(nn.Module):
    """Token ids and an attention mask taken as keywords (``**kwargs``, as HF models): traced."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30, 6)
        self.norm = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(6, 3)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        h = self.drop(self.embed(input_ids)) * attention_mask.unsqueeze(-1).to(torch.float32)
        return self.out(self.norm(h.sum(1) / attention_mask.sum(1, keepdim=True)))


def _recommender_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = {"user": torch.randint(0, 10, (N,), generator=g), "item": torch.randint(0, 20, (N,), generator=g),
         "context": torch.randn(N, 3, generator=g)}
    return x, torch.randn(N, 1, generator=g)


def _token_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(7) < torch.randint(2, 8, (N, 1), generator=g)).to(torch.int64)
    return {"input_ids": torch.randint(0, 30, (N, 7), generator=g), "attention_mask": mask}, \
        torch.randint(0, 3, (N,), generator=g)


def _numpy(x):
    return {name: t.numpy() for name, t in x.items()}


def _same(a, b):
    assert [(r.loss, r.val_loss) for r in a] == [(r.loss, r.val_loss) for r in b]
    assert [r.digests for r in a] == [r.digests for r in b]


@pytest.fixture(scope="module")
def recommender(tmp_path_factory):
    torch.manual_seed(0)
    model = Recommender()
    x, y = _recommender_data()
    path = tmp_path_factory.mktemp("named") / "recommender.pt"
    export_training_module(model, "mse", torch.optim.Adam(model.parameters(), lr=1e-2), path,
                           example_inputs=(x, y), accumulate=2)
    return model, path, x, y


def test_the_metadata_names_each_input_then_y(recommender):
    _, path, _, _ = recommender
    metadata = protocol.read_metadata(path)
    assert metadata["inputs"] == [
        {"name": "user", "shape": [-1], "dtype": "int64"}, {"name": "item", "shape": [-1], "dtype": "int64"},
        {"name": "context", "shape": [-1, 3], "dtype": "float32"}, {"name": "y", "shape": [-1, 1], "dtype": "float32"}]
    assert metadata["capture"] == {"kind": "script", "checked": True, "draws_random": True}


def test_a_tuple_is_named_after_forwards_parameters(tmp_path):
    x, y = _recommender_data()
    path = export_training_module(Recommender(), "mse", "sgd", tmp_path / "m.pt",
                                  example_inputs=((x["user"], x["item"], x["context"]), y))
    assert [s["name"] for s in protocol.read_metadata(path)["inputs"]] == ["user", "item", "context", "y"]


@pytest.mark.parametrize("mode", ["step", "fused", "full"])
def test_java_trains_a_scripted_model_of_several_inputs_like_the_users_model(jvm, recommender, mode):
    model, path, x, y = recommender
    vx, vy = _recommender_data(1)
    arrays = dict(x=_numpy(x), y=y.numpy(), val=(_numpy(vx), vy.numpy()), epochs=3, batch_size=BATCH, mode=mode)
    _same(java.train(path, **arrays), reference.train(path, model=model, **arrays))


def test_a_traced_model_with_an_attention_mask_trains_bitwise_in_a_jvm_of_its_own(jvm, tmp_path):
    torch.manual_seed(0)
    model = MaskedTokens()
    x, y = _token_data()
    path = export_training_module(model, "cross_entropy", "adamw", tmp_path / "tokens.pt",
                                  example_inputs=({n: t[:BATCH] for n, t in x.items()}, y[:BATCH]))
    assert protocol.read_metadata(path)["capture"]["kind"] == "trace"
    settings = dict(epochs=2, batch_size=BATCH, mode="step")
    eager = reference.train(path, _numpy(x), y.numpy(), model=model, **settings)
    _same(java.train(path, _numpy(x), y.numpy(), **settings), eager)
    np.savez(tmp_path / "train.npz", **_numpy(x), y=y.numpy())
    separate = launcher.train(path, tmp_path / "train.npz", history=tmp_path / "h.jsonl", **settings)
    if _separate_jvm_runs_this_libtorch():
        _same(separate, eager)
    else:  # a checkout's own JVM runs the jar's libtorch release: another build, the stated tolerance
        assert_histories_match(eager, separate, rtol=SEPARATE_JVM_RTOL, atol=SEPARATE_JVM_ATOL)


def _separate_jvm_runs_this_libtorch() -> bool:
    """Whether a JVM of its own runs this Python's libtorch, or a pytorch-native jar of this torch's release."""
    import re

    from gradbridge._runtime import classpath

    entries = classpath.resolve().entries
    jars = [m.group(1) for e in entries for m in [re.search(r"pytorch-native-\w+-(\d+\.\d+\.\d+)", e)] if m]
    return not jars or jars[0] == torch.__version__.split("+")[0]


def test_training_modules_named_calls_equal_the_eager_model(jvm, recommender):
    model, path, x, y = recommender
    HashMap = jclass("java.util.HashMap")
    module = load_module(path)
    tensors = {name: to_tensor(t.numpy()) for name, t in x.items()}
    named = HashMap()
    for name in reversed(list(tensors)):  # any order: the metadata orders them
        named.put(name, tensors[name])
    try:
        assert list(module.getInputNames()) == ["user", "item", "context"]
        eager = reference.Reference(path, model)
        eager.model.eval()
        with torch.no_grad():
            expected = eager.model(**x)
        out = module.forward(named)
        assert np.array_equal(np.asarray(out.toExactDoubles()), expected.double().numpy().ravel())
        out.close()
        assert np.isfinite(module.trainStep(named, to_tensor(y.numpy())))
        with pytest.raises(Exception, match=r"train_step: the model takes the inputs \[user, item, context\]: "
                                            r"pass them by name"):
            module.trainStep(tensors["user"], to_tensor(y.numpy()))
        named.put("items", tensors["item"])
        with pytest.raises(Exception, match=r"train_step: input items: the model takes no such input "
                                            r"\(it takes \[user, item, context\]\)"):
            module.trainStep(named, to_tensor(y.numpy()))
        named.remove("items")
        named.remove("item")
        with pytest.raises(Exception, match=r"evaluate: input item is missing \(the model takes"):
            module.evaluate(named, to_tensor(y.numpy()))
        named.put("item", to_tensor(x["item"][:3].numpy()))
        with pytest.raises(Exception, match="forward: user has 24 samples but item has 3"):
            module.forward(named)
    finally:
        module.close()


def test_a_data_file_without_an_input_is_refused_with_the_same_line_in_both_languages(jvm, recommender, tmp_path):
    _, path, x, y = recommender
    file = tmp_path / "partial.npz"
    np.savez(file, user=x["user"].numpy(), context=x["context"].numpy(), y=y.numpy())
    expected = messages.input_missing(str(file), "item", ["user", "context", "y"], ["user", "item", "context", "y"])
    with pytest.raises(InvalidInputError) as python:
        data.load_checked(protocol.read_metadata(path), file)
    assert str(python.value) == expected
    Dataset, Paths = jclass("dev.gradbridge.data.Dataset"), jclass("java.nio.file.Paths")
    module = load_module(path)
    dataset = Dataset.loadNpz(Paths.get(str(file)))
    try:
        with pytest.raises(Exception) as java_side:
            dataset.check(module.getMetadata())
        assert str(java_side.value.getMessage()) == expected
    finally:
        dataset.close()
        module.close()


@pytest.mark.parametrize("inputs, line", [
    (lambda x: {**x, "y": x["user"]}, "input name 'y': expected a Python identifier other than 'y'"),
    (lambda x: {"user": x["user"], "items": x["item"], "context": x["context"]},
     "input items: Recommender.forward has no parameter 'items' (it takes user, item, context)"),
    (lambda x: (x["user"], x["item"], x["context"], x["context"]),
     "example inputs: 4 tensors but Recommender.forward does not name 4 parameters"),
    (lambda x: {**x, "item": [1, 2]}, "input item: expected a tensor, got list"),
])
def test_wrong_inputs_are_refused_at_export_in_one_line(tmp_path, inputs, line):
    x, y = _recommender_data()
    with pytest.raises(ValueError) as info:
        export_training_module(Recommender(), "mse", "sgd", tmp_path / "m.pt", example_inputs=(inputs(x), y))
    assert str(info.value).startswith(line) and "\n" not in str(info.value)
    assert not (tmp_path / "m.pt").exists()
