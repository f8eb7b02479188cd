"""`gradbridge online-demo`: an embedding recommender learning online in Java from a simulated click
stream (``gradbridge.recommender``), its online AUC and log-loss per version, and the eager replay of its
log; ``--model text``: a transformer text classifier with dropout learning from simulated labels
(``gradbridge.commands.text_demo``), its online accuracy per version, and the replay, dropout draws included."""

from __future__ import annotations


def run(rounds: int = 300, batch: int | None = None, out_dir: str | None = None, seed: int = 0,
        out=print, model: str = "recommender") -> int:
    if model == "text":
        return _text(rounds, batch or 32, out_dir or "build/online-demo-text", seed, out)
    from ..recommender import DIM, ITEMS, USERS, run_demo

    batch = batch or 64
    result = run_demo(rounds, batch, out_dir or "build/online-demo", seed)
    rows = result.windows
    out(f"recommender: {USERS} users x {ITEMS} items, dim {DIM}, Adam; {rounds} rounds of {batch} impressions "
        f"in {result.seconds:.1f} s (predict, then feedback)")
    _table(rows, "online AUC", out)
    out(f"plot: {result.plot}")
    out(f"python replay of {result.log_dir}: {result.replay.verdict()}")
    out(f"online AUC {'rose' if result.auc_rose else 'did not rise'}: {rows[0][3]:.4f} -> {rows[-1][3]:.4f}")
    return 0 if result.replay.bitwise and result.auc_rose else 1


def _text(rounds: int, batch: int, out_dir: str, seed: int, out) -> int:
    from .text_demo import LENGTH, VOCAB, WIDTH, run_text_demo

    result = run_text_demo(rounds, batch, out_dir, seed)
    rows = result.windows
    out(f"text classifier: transformer encoder (width {WIDTH}, dropout 0.1) over {VOCAB} tokens x {LENGTH}, AdamW; "
        f"{rounds} rounds of {batch} sentences in {result.seconds:.1f} s (predict, then feedback)")
    _table(rows, "accuracy", out)
    out(f"python replay of {result.log_dir}: {result.replay.verdict()}")
    out(f"online accuracy {'rose' if result.accuracy_rose else 'did not rise'}: {rows[0][3]:.4f} -> {rows[-1][3]:.4f}")
    return 0 if result.replay.bitwise and result.accuracy_rose else 1


def _table(rows, metric: str, out) -> None:
    """Per window of rounds: the versions that answered, the events, the online metric and log-loss."""
    out(f"{'versions':>13}  {'events':>7}  {metric:>10}  {'log-loss':>9}")
    for first, last, n, value, loss in rows:
        out(f"{first:>6}-{last:<6}  {n:>7}  {value:>10.4f}  {loss:>9.4f}")
