"""`gradbridge online-demo`: an embedding recommender learning online in Java from a simulated
click stream (``gradbridge.recommender``), its online AUC and log-loss per version, and the eager
replay of its log."""

from __future__ import annotations

from ..recommender import DIM, ITEMS, USERS, run_demo


def run(rounds: int = 300, batch: int = 64, out_dir: str = "build/online-demo", seed: int = 0,
        out=print) -> int:
    result = run_demo(rounds, batch, out_dir, seed)
    rows = result.windows
    out(f"recommender: {USERS} users x {ITEMS} items, dim {DIM}, Adam; {rounds} rounds of {batch} impressions "
        f"in {result.seconds:.1f} s (predict, then feedback)")
    out(f"{'versions':>13}  {'events':>7}  {'online AUC':>10}  {'log-loss':>9}")
    for first, last, n, a, ll in rows:
        out(f"{first:>6}-{last:<6}  {n:>7}  {a:>10.4f}  {ll:>9.4f}")
    out(f"plot: {result.plot}")
    out(f"python replay of {result.log_dir}: {result.replay.verdict()}")
    out(f"online AUC {'rose' if result.auc_rose else 'did not rise'}: {rows[0][3]:.4f} -> {rows[-1][3]:.4f}")
    return 0 if result.replay.bitwise and result.auc_rose else 1
