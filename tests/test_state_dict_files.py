"""Fine-tuned weights back where they came from: `gradbridge state-dict` turns a Java run's checkpoint into a
safetensors (or torch.save) file that the user's own model takes with ``load_state_dict``, and a PEFT model's
adapter alone into PEFT's own folder, which ``PeftModel.from_pretrained`` loads; each compared bit for bit with
the same training done eagerly, in the same test, by the user's own model and optimizer."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from gradbridge import export_training_module, java, protocol
from gradbridge._runtime import shuffle
from gradbridge.commands import main as cli
from gradbridge.export.weights import ADAPTER_CONFIG, ADAPTER_WEIGHTS

from .data import labelled


class Tied(nn.Module):
    """Two layers sharing one weight, BatchNorm statistics, a bfloat16 head, a buffer kept out of the state_dict."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.mix = nn.Linear(8, 8)
        self.again = nn.Linear(8, 8)
        self.again.weight = self.mix.weight
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 3).to(torch.bfloat16)
        self.register_buffer("scale", torch.full((3,), 0.5), persistent=False)

    def forward(self, x):
        h = self.norm(self.again(torch.relu(self.mix(torch.relu(self.embed(x))))))
        return self.head(h.to(torch.bfloat16)).float() * self.scale


def _eager(model, optimizer, x, y, *, epochs, batch_size, seed=0):
    """The user's own loop, in the order Java's Trainer takes the batches (its seed per epoch, its shuffle)."""
    loss_fn = nn.CrossEntropyLoss()
    n = len(y)
    for epoch in range(epochs):
        torch.manual_seed(shuffle.torch_seed(seed, epoch))
        perm = torch.tensor(shuffle.permutation(seed, epoch, n), dtype=torch.int64)
        for i in range(0, n, batch_size):
            rows = perm[i:i + batch_size]
            batch = {k: v.index_select(0, rows) for k, v in x.items()} if isinstance(x, dict) else x.index_select(0, rows)
            optimizer.zero_grad()
            output = model(**batch) if isinstance(batch, dict) else model(batch)
            loss_fn(output, y.index_select(0, rows)).backward()
            optimizer.step()


def _same(mine, theirs):
    assert list(mine) == list(theirs) or sorted(mine) == sorted(theirs), sorted(set(mine) ^ set(theirs))
    for key, value in theirs.items():
        assert mine[key].dtype == value.dtype and torch.equal(mine[key], value), key


@pytest.mark.parametrize("fmt", ["torchscript", pytest.param("export", marks=pytest.mark.slow)])
def test_a_java_run_goes_back_into_the_users_model_as_safetensors(jvm, tmp_path, capsys, fmt):
    # Given the user's model (tied weights, BatchNorm, a bfloat16 head) and Adam over its parameters
    torch.manual_seed(0)
    model = Tied()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = labelled(32, tensors=True)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt", example_inputs=(x[:8], y[:8]),
                                  format=fmt)
    assert protocol.read_metadata(path)[protocol.WEIGHTS_KEY] == {protocol.WEIGHTS_TIED: {"again.weight": "mix.weight"}}
    # When Java trains it (a checkpoint after each epoch) and the CLI writes the checkpoint's state_dict as safetensors
    java.train(path, x.numpy(), y.numpy(), epochs=3, batch_size=8, checkpoint=tmp_path / "ckpt.pt")
    out = tmp_path / "trained.safetensors"
    assert cli.main(["state-dict", str(tmp_path / "ckpt.pt"), "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    # Then the file holds the model's own keys and dtypes, and a fresh model takes it strictly
    _eager(model, optimizer, x, y, epochs=3, batch_size=8)
    written = load_file(out)
    _same(written, model.state_dict())
    fresh = Tied()
    fresh.load_state_dict(written)
    # ... with every tensor bit for bit the user's eager run's (the tied weight one tensor still)
    _same(fresh.state_dict(), model.state_dict())
    assert fresh.again.weight is fresh.mix.weight and int(fresh.norm.num_batches_tracked) == 12
    # ... and torch.save's file (by the suffix) holds the same
    assert cli.main(["state-dict", str(tmp_path / "ckpt.pt"), "-o", str(tmp_path / "trained.pt")]) == 0
    _same(torch.load(tmp_path / "trained.pt", weights_only=True), model.state_dict())


def _lora_bert(seed=0):
    """A tiny random BERT classifier with PEFT LoRA on its attention (the zoo's), wrapped as a user does."""
    import peft
    import transformers as hf

    from .models.zoo import _SMALL, TokenClassifier

    torch.manual_seed(seed)
    base = hf.BertForSequenceClassification(hf.BertConfig(**_SMALL))
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.1,
                             modules_to_save=["classifier"])
    return TokenClassifier(peft.get_peft_model(base, config))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_a_lora_adapter_trained_from_java_loads_with_peft(jvm, tmp_path, fmt):
    import peft
    import transformers as hf

    from .models.zoo import _SMALL, _tokens

    # Given a LoRA BERT with AdamW over the whole model (PEFT froze the base), as PEFT's tutorials build it
    model = _lora_bert()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = _tokens(16, 1)
    path = export_training_module(model, "cross_entropy", optimizer, tmp_path / "m.pt",
                                  example_inputs=({k: v[:4] for k, v in x.items()}, y[:4]), format=fmt)
    # When Java trains it and the CLI writes its adapter alone (and the whole state_dict)
    java.train(path, {k: v.numpy() for k, v in x.items()}, y.numpy(), epochs=2, batch_size=4,
               checkpoint=tmp_path / "ckpt.pt")
    folder, whole = tmp_path / "adapter", tmp_path / "whole.safetensors"
    assert cli.main(["state-dict", str(tmp_path / "ckpt.pt"), "--adapter", str(folder), "-o", str(whole)]) == 0
    # Then the folder is what the user's eager run's PeftModel.save_pretrained writes, byte for byte
    _eager(model, optimizer, x, y, epochs=2, batch_size=4)
    model.model.save_pretrained(tmp_path / "eager")
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        assert (folder / name).read_bytes() == (tmp_path / "eager" / name).read_bytes(), name
    # ... PeftModel.from_pretrained on a fresh base loads it: the eager model's tensors and outputs, bit for bit
    torch.manual_seed(0)
    loaded = peft.PeftModel.from_pretrained(hf.BertForSequenceClassification(hf.BertConfig(**_SMALL)), folder)
    _same(loaded.state_dict(), model.model.state_dict())
    model.eval()
    probe, _ = _tokens(5, 2)
    with torch.no_grad():
        assert torch.equal(loaded(**probe).logits, model(**probe))
    # ... and the whole state_dict goes into a fresh instance of the user's model
    fresh = _lora_bert()
    fresh.load_state_dict(load_file(whole))
    _same(fresh.state_dict(), model.state_dict())
