"""`gradbridge online-demo`: the recommender learns online in Java, its online AUC rises, the eager
replay of its log is bitwise, and the plot is written."""

from __future__ import annotations

from gradbridge.commands.main import main as cli_main
from gradbridge.recommender import auc


def test_auc_matches_the_pairwise_definition():
    import numpy as np

    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=60).astype(float)  # ties on purpose
    labels = rng.integers(0, 2, size=60)
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairwise = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert abs(auc(scores, labels) - pairwise) < 1e-12


def test_online_demo_auc_rises_and_replay_is_bitwise(jvm, tmp_path, capsys):
    assert cli_main(["online-demo", "--rounds", "160", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "python replay of" in out and "bitwise identical: 161 versions, 160 micro-batches, 10240 events" in out
    assert "online AUC rose" in out
    assert (tmp_path / "online.png").stat().st_size > 10_000


def test_online_demo_text_classifier_with_dropout_learns_and_replays_bitwise(jvm, tmp_path, capsys):
    """The transformer variant: a text classifier with dropout and a constant position-id buffer."""
    assert cli_main(["online-demo", "--model", "text", "--rounds", "100", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bitwise identical: 101 versions, 100 micro-batches, 3200 events" in out
    assert "online accuracy rose" in out
