"""`gradbridge bench`'s memory verdict: a plateau after warm-up is told from a leak, on the last
window of a long run. The long runs are `gradbridge bench` (200,000 steps per surface); here the
verdict on known curves, and one short run of each surface."""

from __future__ import annotations

import numpy as np
import pytest

from gradbridge.bench import memory as bench_memory

STEPS = np.arange(0, 200_001, 2_500)


def _noise(seed=0):
    return np.random.default_rng(seed).normal(0, 4096, STEPS.size)  # a page here and there


def test_warm_up_then_flat_is_a_plateau_even_though_a_short_window_would_call_it_a_leak():
    # RSS grows by 40 MiB over the first ~100,000 steps (decaying), then stays flat
    rss = 500e6 + 40 * 2**20 * (1 - np.exp(-STEPS / 15_000)) + _noise()
    result = bench_memory.classify(list(zip(STEPS, rss)))
    assert result["verdict"] == bench_memory.PLATEAU, bench_memory.describe(result)
    assert result["warmup_growth_bytes"] > 30 * 2**20
    first_20k = [(s, r) for s, r in zip(STEPS, rss) if s <= 20_000]
    assert bench_memory.classify(first_20k)["verdict"] != bench_memory.PLATEAU  # what a 20k window saw


def test_steady_growth_is_a_leak():
    rss = 500e6 + 160 * STEPS + _noise(1)  # 160 bytes/step, forever
    result = bench_memory.classify(list(zip(STEPS, rss)))
    assert result["verdict"] == bench_memory.LEAK and result["slope_bytes_per_step"] == pytest.approx(160, rel=0.05)
    assert bench_memory.describe(result).startswith("leak: 1") and "bytes/step over steps 122,500..200,000" in \
        bench_memory.describe(result)


def test_growth_that_slows_but_has_not_stopped_says_so():
    rss = 500e6 + 40 * 2**20 * (1 - np.exp(-STEPS / 50_000)) + _noise(2)
    result = bench_memory.classify(list(zip(STEPS, rss)))
    assert result["verdict"] == bench_memory.SETTLING and bench_memory.describe(result).endswith("run longer to tell")


def test_too_few_samples_are_refused():
    with pytest.raises(ValueError, match="samples; need at least"):
        bench_memory.classify([(0, 1), (1, 1), (2, 1)])


@pytest.mark.parametrize("surface", ["in_process", "trainer_cli", "online_learner"])
def test_each_surface_runs_and_gets_a_verdict(jvm, surface):
    result = getattr(bench_memory, surface)(600)
    assert result["verdict"] in (bench_memory.PLATEAU, bench_memory.LEAK, bench_memory.SETTLING)
    assert len(result["samples"]) >= 6 and all(rss > 0 for _, rss in result["samples"])
    assert result["steps"] >= 600 and result["surface"]
