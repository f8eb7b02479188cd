"""What the Spark tests share (tests/test_spark.py, test_spark_models.py, test_spark_cluster.py, test_faults_spark.py):
the trainer run in a JVM of its own, the bitwise comparison of two histories, the scripted recommender of several
inputs with its data, and the gloo symbols of a native library (gloo lives in spark/'s library, never in the core's)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import torch

from gradbridge import export_training_module
from gradbridge._runtime import sparkrun


def spark_train(*args, master: str, exchange: str = "", one_round_bytes: int | None = None,
                threads: int | None = None) -> tuple:
    """Run the Spark trainer (with ``exchange``, the Spark setting spark.gradbridge.exchange,
    ``one_round_bytes``, spark.gradbridge.exchange.oneRoundBytes, and ``threads``,
    spark.gradbridge.threads); (CompletedProcess, stats dict) and assert success."""
    stats = Path(args[args.index("--history") + 1]).with_suffix(".stats.json")
    options = [f"-Dspark.gradbridge.exchange={exchange}"] if exchange else []
    if one_round_bytes is not None:
        options.append(f"-Dspark.gradbridge.exchange.oneRoundBytes={one_round_bytes}")
    if threads is not None:
        options.append(f"-Dspark.gradbridge.threads={threads}")
    result = sparkrun.run(["--master", master, "--stats", stats, *map(str, args)], check=False, jvm_options=options)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, json.loads(stats.read_text())


def assert_bitwise(java, python) -> None:
    """Two histories (or lists of records): epochs, losses, digests and values all equal."""
    java, python = list(java), list(python)
    assert len(java) == len(python)
    for j, p in zip(java, python):
        assert j.epoch == p.epoch
        assert j.loss == p.loss, (j.epoch, j.loss, p.loss)
        assert j.digests == p.digests, j.epoch
        for name, values in p.parameters.items():
            assert np.array_equal(np.asarray(j.parameters[name]), values), (j.epoch, name)


class Recommender(torch.nn.Module):
    """User and item ids and context features as three tensors (tests/test_named_inputs.py's, without its
    dropout: each Spark task draws from its own JVM's generator). Scripted."""

    def __init__(self):
        super().__init__()
        self.users = torch.nn.Embedding(10, 4)
        self.items = torch.nn.Embedding(20, 4)
        self.head = torch.nn.Sequential(torch.nn.Linear(8 + 3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, user: torch.Tensor, item: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.users(user), self.items(item), context], 1))


def recommender_case(folder: Path, n: int = 90) -> dict:
    """The recommender exported with SGD (momentum) and mse, and ``n`` rows of its data as an .npz (user and
    item ids, context features, y); ``parquet``: where its Parquet copy goes (``sparkrun.to_parquet``)."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = Recommender()
    x = {"user": torch.randint(0, 10, (n,), generator=g), "item": torch.randint(0, 20, (n,), generator=g),
         "context": torch.randn(n, 3, generator=g)}
    y = torch.randn(n, 1, generator=g)
    path = export_training_module(model, "mse", torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  folder / "recommender.pt", example_inputs=(x, y))
    return data_case(folder, "recommender", model, path, x, y)


def data_case(folder: Path, name: str, model, path: Path, x: dict, y) -> dict:
    arrays = {k: t.numpy() for k, t in x.items()}
    np.savez(folder / f"{name}.npz", **arrays, y=y.numpy())
    return {"model": model, "path": path, "x": arrays, "y": y.numpy(), "npz": folder / f"{name}.npz",
            "parquet": folder / f"{name}.parquet"}


def gloo_symbols(library: Path) -> list:
    """The dynamic symbols of a shared library, defined or needed, that name gloo (``nm -D``)."""
    listing = subprocess.run(["nm", "-D", "-C", str(library)], capture_output=True, text=True, check=True).stdout
    return [line for line in listing.splitlines() if "gloo" in line.lower()]
