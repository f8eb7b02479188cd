"""`gradbridge online-bench` runs end to end on small sizes and reports both sides' figures."""

from __future__ import annotations

import json

from gradbridge.bench.online import EVENTS, FEEDERS
from gradbridge.commands.main import ONLINE_BENCH_EVENTS, ONLINE_BENCH_FEEDERS, main as cli_main


def test_online_bench_reports_java_and_python_figures(jvm, tmp_path, capsys):
    assert cli_main(["online-bench", "--events", "512", "--batch", "16", "--predictions", "200",
                     "--publish-every", "4", "--feeders", "3", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "java OnlineLearner" in out and "python lock + thread" in out and "goals (java, this machine):" in out
    for target in ("predict p50 training on", "predict p99 with training on", "learning fsync never",
                   "learning fsync always", "load average"):
        assert target in out, target
    figures = json.loads((tmp_path / "online-bench.json").read_text())
    for side in ("java", "python"):
        for key in ("predict_idle_p50_us", "predict_idle_p99_us", "predict_training_p50_us",
                    "predict_training_p99_us", "online_events_per_s", "fused_events_per_s"):
            assert figures[side][key] > 0, (side, key)
    for key in ("online_always_events_per_s", "step_events_per_s"):
        assert figures["java"][key] > 0, key
    # every event applied, from 3 concurrent clients: 16-row calls, micro-batches of 16
    assert figures["java"]["online_updates"] == 512 // 16
    assert figures["java"]["publish_every"] == 4
    assert figures["java"]["feeders"] == figures["feeders"] == 3
    assert "--feeders 3" in figures["command"]
    assert len(figures["load_average"]["start"]) == len(figures["load_average"]["end"]) == 3
    # latency: one sample per round on each side, p99 judged pooled, each round's beside it
    for side in ("java", "python"):
        by_round = figures[side]["predict_by_round"]
        assert all(len(by_round[k]) == 5 and min(by_round[k]) > 0 for k in
                   ("idle_p50_us", "idle_p99_us", "training_p50_us", "training_p99_us")), side
        assert len(figures[side]["updates_during_predictions"]) == 5
    assert " rounds pooled; python " in out and " rounds)" in out


def test_online_bench_defaults_agree_with_the_parser():
    assert (ONLINE_BENCH_FEEDERS, ONLINE_BENCH_EVENTS) == (FEEDERS, EVENTS)
