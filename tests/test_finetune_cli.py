"""Fine-tuning from the command line and pretrained weights both ways; bad fine-tuning input is
refused at export with one line naming it, and nothing is written."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as ls

from gradbridge.commands import main as cli
from gradbridge import export_training_module, java, protocol, reference
from gradbridge.errors import CLI_ERROR_PREFIX
from gradbridge.export import state_dict_of

RECOMMENDER = textwrap.dedent('''
    import torch
    from torch import nn

    class Recommender(nn.Module):
        """Embeddings of (user, item) index pairs -> a rating."""
        def __init__(self, users: int = 20, items: int = 30, dim: int = 8):
            super().__init__()
            self.users = nn.Embedding(users, dim)
            self.items = nn.Embedding(items, dim)
            self.head = nn.Linear(2 * dim, 1)

        def forward(self, x):
            return self.head(torch.cat([self.users(x[:, 0]), self.items(x[:, 1])], dim=1))

    def build():
        return Recommender()
''')


def _ratings(n=128, seed=0):
    rng = np.random.default_rng(seed)
    x = np.stack([rng.integers(0, 20, n), rng.integers(0, 30, n)], axis=1).astype(np.int64)
    y = ((x[:, :1] % 5) - (x[:, 1:] % 3) + rng.normal(0, 0.1, (n, 1))).astype(np.float32)
    return x, y


@pytest.fixture
def recommender_module(tmp_path, monkeypatch):
    (tmp_path / "recsys.py").write_text(RECOMMENDER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys
    sys.modules.pop("recsys", None)
    return importlib.import_module("recsys")


def test_cli_exports_every_fine_tuning_option_and_java_trains_it_bitwise(jvm, tmp_path, recommender_module, capsys):
    # Given pretrained weights for the recommender, saved as a state_dict
    torch.manual_seed(42)
    pretrained = recommender_module.build()
    torch.save(pretrained.state_dict(), tmp_path / "pretrained.pt")
    out = tmp_path / "rec.pt"
    # When the CLI exports it with int64 inputs, the user table frozen, a slower item group,
    # warm-up then cosine per step, clipping and accumulation
    code = cli.main(["export", "recsys:build", "-o", str(out), "--input-shape", "2", "--input-dtype", "int64",
                     "--loss", "mse", "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.01",
                     "--freeze", "users.", "--group", "items.:lr=0.001,weight_decay=0,betas=0.8|0.99",
                     "--scheduler", "linear:start_factor=0.1,total_iters=4", "--scheduler", "cosine:T_max=20",
                     "--milestones", "4", "--clip-norm", "1.0", "--accumulate", "2",
                     "--init-weights", str(tmp_path / "pretrained.pt")])
    assert code == 0, capsys.readouterr().err
    # Then the metadata holds it all
    metadata = protocol.read_metadata(out)
    assert metadata["inputs"][0] == {"name": "x", "shape": [-1, 2], "dtype": "int64"}
    assert [p["name"] for p in metadata["parameters"] if not p["trainable"]] == ["users.weight"]
    assert [(g["params"], g["lr"], g["weight_decay"], g["betas"]) for g in metadata["optimizer"]["groups"]] == [
        (["head.weight", "head.bias"], 0.01, 0.01, [0.9, 0.999]), (["items.weight"], 0.001, 0, [0.8, 0.99])]
    assert metadata["fine_tuning"] == {
        "scheduler": {"name": "sequential", "milestones": [4],
                      "schedulers": [{"name": "linear", "start_factor": 0.1, "total_iters": 4},
                                     {"name": "cosine", "T_max": 20}]},
        "scheduler_interval": "step", "clip": {"kind": "norm", "max": 1.0, "norm_type": 2.0}, "accumulate": 2}
    # the export starts from the pretrained weights
    initial = state_dict_of(out)
    assert all(torch.equal(initial[k], v) for k, v in pretrained.state_dict().items())
    # And Java trains it bit for bit like eager PyTorch (the reference rebuilds the same set-up)
    x, y = _ratings()
    settings = dict(epochs=4, batch_size=32, seed=2, mode="step")
    in_java = java.train(out, x, y, **settings)
    in_python = reference.train(out, x, y, model=pretrained, **settings)
    for a, b in zip(in_java, in_python):
        assert (a.loss, a.digests, a.lrs) == (b.loss, b.digests, b.lrs)
    assert np.array_equal(in_java[-1].parameters["users.weight"],
                          pretrained.users.weight.detach().double().numpy().ravel())


def test_java_checkpoint_back_to_a_state_dict_bitwise(jvm, tmp_path, capsys):
    # Given a model trained from Java with a checkpoint after every epoch
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(64, 4)
    y = torch.randint(0, 3, (64,))
    path = export_training_module(model, "cross_entropy", {"name": "adam", "lr": 0.01}, tmp_path / "m.pt",
                                  example_inputs=(x, y))
    history = java.train(path, x.numpy(), y.numpy(), epochs=3, batch_size=16, checkpoint=tmp_path / "ckpt.pt")
    # When the CLI turns the checkpoint into a state_dict file
    assert cli.main(["state-dict", str(tmp_path / "ckpt.pt"), "-o", str(tmp_path / "trained.pt")]) == 0
    # Then a fresh eager model takes it, with Java's parameters bit for bit (and the BatchNorm statistics)
    fresh = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    fresh.load_state_dict(torch.load(tmp_path / "trained.pt", weights_only=True))
    for name, p in fresh.named_parameters():
        assert np.array_equal(p.detach().double().numpy().ravel(), history[-1].parameters[name]), name
    assert int(fresh[1].num_batches_tracked) == 12
    assert not torch.equal(fresh[1].running_mean, torch.zeros(8))


def _refused(capsys, tmp_path, argv):
    (tmp_path / "out.pt").write_bytes(b"old")
    code = cli.main(["export", *argv, "-o", str(tmp_path / "out.pt")])
    err = capsys.readouterr().err
    assert code == 1 and (tmp_path / "out.pt").read_bytes() == b"old"
    assert err.count("\n") == 1 and err.startswith(CLI_ERROR_PREFIX)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.pt")] == []
    return err[len(CLI_ERROR_PREFIX):].strip()


MLP = ["mlp", "--input-shape", "4", "--loss", "cross_entropy", "--optimizer", "sgd", "--lr", "0.1"]


@pytest.mark.parametrize("flags, message", [
    (["--freeze", "nope."], "freeze 'nope.': no parameter of the model starts with it"),
    (["--group", "zz:lr=0.1"], "parameter group 0: no trainable parameter of the model starts with 'zz'"),
    (["--freeze", "0.", "--group", "0.:lr=0.1"], "parameter group 0: no trainable parameter of the model starts "
                                                 "with '0.'"),
    (["--scheduler", "step:step_size=0"], "scheduler step: step_size must be positive, got 0"),
    (["--scheduler", "cosine:T_max=-5"], "scheduler cosine: T_max must be positive, got -5"),
    (["--scheduler", "lambda:x=1"], "cannot export scheduler 'lambda'; supported: StepLR, MultiStepLR, "
                                    "ExponentialLR, CosineAnnealingLR, LinearLR, OneCycleLR, SequentialLR, "
                                    "ReduceLROnPlateau"),
    (["--clip-norm", "-1"], "clip_grad_norm must be a finite number >= 0, got -1.0"),
    (["--clip-value", "-0.5"], "clip_grad_value must be a finite number >= 0, got -0.5"),
    (["--accumulate", "0"], "accumulate must be an integer >= 1, got 0"),
], ids=["freeze", "group-prefix", "group-frozen", "step-size", "t-max", "lambda", "clip-norm", "clip-value",
        "accumulate"])
def test_bad_fine_tuning_flags_are_refused_with_one_line(tmp_path, capsys, flags, message):
    assert _refused(capsys, tmp_path, MLP + flags) == message


def test_state_dict_with_wrong_names_or_shapes_is_refused(tmp_path, capsys):
    from gradbridge.models import mlp
    good = mlp().state_dict()  # what the CLI's `mlp` builds
    wrong_name = dict(good)
    wrong_name["extra.weight"] = wrong_name.pop(next(iter(good)))
    torch.save(wrong_name, tmp_path / "names.pt")
    torch.save({k: v[..., :1] if v.dim() else v for k, v in good.items()}, tmp_path / "shapes.pt")
    first = next(iter(good))
    assert _refused(capsys, tmp_path, MLP + ["--init-weights", str(tmp_path / "names.pt")]) == \
        f"init weights {tmp_path / 'names.pt'}: no value for {first}"
    message = _refused(capsys, tmp_path, MLP + ["--init-weights", str(tmp_path / "shapes.pt")])
    assert message.startswith(f"init weights {tmp_path / 'shapes.pt'}: {first} has shape [")


def test_bad_fine_tuning_objects_are_refused_before_anything_is_written(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    model[0].weight.requires_grad_(False)
    example = (torch.randn(4, 4), torch.tensor([0, 1, 2, 0]))
    out = tmp_path / "m.pt"

    def refused(optimizer, message, **options):
        with pytest.raises(ValueError) as error:
            export_training_module(model, "cross_entropy", optimizer, out, example_inputs=example, **options)
        assert str(error.value) == message and "\n" not in message
        assert not out.exists() and list(tmp_path.iterdir()) == []

    # (a frozen parameter inside a torch.optim instance's group is taken, as torch.optim takes it:
    # tests/test_frozen_in_optimizer.py; in a spec's explicit group it is refused)
    refused({"name": "sgd", "lr": 0.1, "groups": [{"params": ["0.weight", "0.bias", "2.weight", "2.bias"]}]},
            "frozen parameter 0.weight (requires_grad=False) is in parameter group 0")
    # a group naming parameters the model does not have
    refused({"name": "sgd", "lr": 0.1, "groups": [{"params": ["2.weight", "2.bias", "0.bias", "9.weight"]}]},
            "parameter group 0 names 9.weight, which the model does not have")
    refused(torch.optim.SGD([model[0].bias, model[2].weight, model[2].bias, torch.zeros(3, requires_grad=True)],
                            lr=0.1),
            "parameter group 0 holds a tensor of shape [3] that is not a parameter of the model")
    # a trainable parameter that no group trains
    refused(torch.optim.SGD([model[2].weight, model[2].bias], lr=0.1),
            "parameter 0.bias requires grad but is in no parameter group; freeze it or add it to a group")
    trainable = [p for p in model.parameters() if p.requires_grad]
    # schedules with a non-positive period
    optimizer = torch.optim.SGD(trainable, lr=0.1)
    refused(optimizer, "scheduler step: step_size must be positive, got 0", scheduler=ls.StepLR(optimizer, 0))
    refused({"name": "sgd"}, "scheduler linear: total_iters must be positive, got 0",
            scheduler={"name": "linear", "total_iters": 0})
    # negative clipping and a state_dict that does not fit
    refused({"name": "sgd"}, "clip_grad_norm must be a finite number >= 0, got -0.1", clip_grad_norm=-0.1)
    refused({"name": "sgd"}, "init weights: 0.weight has shape [4, 8], the model's has [8, 4]",
            init_weights={**model.state_dict(), "0.weight": torch.zeros(4, 8)})
