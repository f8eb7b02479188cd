"""`gradbridge bench`: the statistics that judge its targets, its flags, and one tiny real run.

Timings are reported, never asserted: the run below checks the shape of what it writes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import torch
import pytest

from gradbridge.bench import cases, report, workers
from gradbridge.bench.stats import CANNOT_TELL, MET, MISSED, compare, ratio_ci, verdict
from gradbridge.commands import main as cli
from gradbridge._runtime.devtree import root

REPO_ROOT = root()


def test_ratio_of_identical_rounds_is_one_with_no_spread():
    series = [1.0, 2.0, 3.0, 5.0]
    result = ratio_ci(series, series)
    assert result == {"ratio": 1.0, "ci95": [1.0, 1.0], "rounds": 4}


def test_ratio_cancels_drift_between_rounds():
    """A variant that is always 1.5x the other, on a machine whose speed drifts 10x across
    rounds: the per-round ratio is exact, where a ratio of medians over rounds would not be."""
    drift = np.geomspace(1, 10, 12)
    result = ratio_ci(1.5 * drift, drift)
    assert result["ratio"] == pytest.approx(1.5) and result["ci95"] == pytest.approx([1.5, 1.5])


def test_interval_narrows_with_more_rounds_and_covers_the_truth():
    rng = np.random.default_rng(1)
    widths = []
    for rounds in (5, 80):
        base = rng.uniform(1, 2, rounds)
        noisy = 1.1 * base * rng.lognormal(0, 0.1, rounds)
        result = ratio_ci(noisy, base)
        low, high = result["ci95"]
        assert low <= 1.1 <= high
        assert low <= result["ratio"] <= high
        widths.append(high - low)
    assert widths[1] < widths[0]


def test_ratio_needs_paired_rounds():
    with pytest.raises(ValueError):
        ratio_ci([1.0], [1.0])
    with pytest.raises(ValueError):
        ratio_ci([1.0, 2.0], [1.0, 2.0, 3.0])


@pytest.mark.parametrize("interval, expected", [
    ([0.9, 1.19], MET), ([1.2, 1.2], MET), ([1.21, 1.5], MISSED), ([1.1, 1.3], CANNOT_TELL),
])
def test_verdict_judges_the_whole_interval(interval, expected):
    assert verdict(interval, 1.2) == expected


@pytest.mark.parametrize("interval, expected", [
    ([1.01, 1.2], "slower"), ([0.8, 0.99], "faster"), ([0.97, 1.04], CANNOT_TELL),
])
def test_compare_says_which_way_or_cannot_tell(interval, expected):
    assert compare(interval) == expected


def _case(key, variants):
    return {"case": key, "key": key, "variants": variants}


def test_targets_carry_value_interval_and_verdict():
    quiet = {"ratio": 1.02, "ci95": [1.0, 1.05]}
    noisy = {"ratio": 1.1, "ci95": [0.8, 1.6]}
    results = {"steps": [
        _case("seed", {"c": {"vs_e": quiet, "vs_a": quiet}, "d": {"vs_e_fused": noisy}, "e": {}, "e'": {}, "a": {}}),
        _case("big", {"c": {"vs_a": {"ratio": 1.2, "ci95": [1.1, 1.3]}}, "a": {}}),
    ]}
    found = {t["target"].split(":")[0]: t for t in report.targets(results)}
    assert found["Java train_step (c) <= 1.1x native train_step (e)"]["verdict"] == MET
    assert found["Java fused (d) <= 1.05x native fused loop (e')"]["verdict"] == CANNOT_TELL
    assert found["Java train_step (c) <= 0.7x eager Python (a)"]["verdict"] == MISSED
    big = found["Java train_step (c) in its own JVM within 3% of eager Python (a)"]
    assert big["verdict"] == MISSED and big["ci95"] == [1.1, 1.3] and big["value"] == 1.2
    answers = report.answers(results)
    assert [a["answer"] for a in answers] == ["slower"]


def test_a_variant_left_out_drops_its_targets():
    results = {"steps": [_case("seed", {"a": {}, "e": {}})]}
    assert report.targets(results) == []


def test_process_counters_count_this_process():
    counters = workers.proc_counters()
    if not counters:
        pytest.skip("no /proc here")
    before = counters["minor_faults"]
    block = np.ones(64 * 1024 * 1024 // 8)  # fresh pages: at least a few faults
    block[::512] = 2.0
    after = workers.proc_counters()
    assert after["minor_faults"] > before
    assert after["cpu_seconds"] >= counters["cpu_seconds"] > 0


def test_cli_names_match_the_benchmark():
    assert cli.BENCH_CASES == tuple(case.key for case in cases.CASES)
    assert cli.BENCH_VARIANTS == (*cases.VARIANTS, *cases.IN_PROCESS)


@pytest.mark.parametrize("flags, word", [
    (["--rounds", "1"], "--rounds"), (["--rounds", "many"], "--rounds"), (["--threads", "0"], "--threads"),
    (["--cases", "seed,huge"], "--cases"),
    (["--only", "c,z"], "--only"), (["--java-env", "NOVALUE"], "--java-env"),
])
def test_bad_flags_fail_with_one_line(flags, word, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", *flags])
    assert exit_info.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0] and lines[0].startswith("gradbridge: error:"), lines


@pytest.mark.gradle
def test_tiny_run_writes_rounds_intervals_environment_and_verdicts(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gradbridge", "bench", "--quick", "--cases", "seed", "--rounds", "2",
                             "--only", "a,c,d,e,e'", "--steps-only", "--java-env", "GRADBRIDGE_BENCH_PROBE=1",
                             "--out-dir", tmp_path], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "time per training step" in result.stdout and "targets" in result.stdout
    document = json.loads((tmp_path / "bench.json").read_text())
    machine = document["machine"]
    assert machine["rounds"] == 2 and len(machine["load_average_at_start"]) == 3
    assert machine["java_settings"]["env"] == {"GRADBRIDGE_BENCH_PROBE": "1"}
    (case,) = document["steps"]
    assert set(case["variants"]) == {"a", "c", "d", "e", "e'"}
    for key, variant in case["variants"].items():
        assert len(variant["rounds_s"]) == 2 and variant["min_s"] <= variant["median_s"]
        low, high = variant["vs_a"]["ci95"]
        assert low <= variant["vs_a"]["ratio"] <= high
        environment = variant["environment"]
        assert environment["intra_op_threads"] >= 1 and environment["where"]
    assert case["variants"]["c"]["environment"]["jvm_options"]  # the JVM reported its own settings
    assert case["variants"]["e"]["environment"]["command"][0].endswith("train_loop")
    verdicts = {t["target"].split(":")[0]: t["verdict"] for t in document["targets"]}
    assert set(verdicts) == {"Java train_step (c) <= 1.1x native train_step (e)",
                             "Java fused (d) <= 1.05x native fused loop (e')",
                             "Java train_step (c) <= 0.7x eager Python (a)"}
    assert set(verdicts.values()) <= {MET, MISSED, CANNOT_TELL}
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (REPO_ROOT / "build" / "bench-native" / f"torch{torch.__version__}" / "train_loop").exists()


@pytest.mark.gradle
def test_breakdown_times_the_layers_of_a_call(tmp_path):
    model, path = cases._export(cases.CASES[0], tmp_path)
    x, y = cases._data(cases.CASES[0], cases.CASES[0].batch)
    np.savez(tmp_path / "batch.npz", x=x, y=y)
    parts = cases.breakdown(path, tmp_path / "batch.npz", rounds=2, calls=5)
    assert set(parts["median_s"]) == {"bare", "train_step"}
    assert set(parts["vs_bare"]) == {"train_step"}
    assert all(len(v) == 2 and min(v) > 0 for v in parts["per_call_seconds"].values())


@pytest.mark.gradle
def test_a_real_model_case_judges_java_fused_against_eager(tmp_path):
    """The real-shape cases (ResNet-18, transformer encoder, LSTM) time Java's fused epoch against
    eager and judge "<= 1.0x"; the LSTM, the smallest, runs here."""
    result = subprocess.run([sys.executable, "-m", "gradbridge", "bench", "--quick", "--cases", "lstm", "--rounds", "2",
                             "--only", "a,d*", "--steps-only", "--out-dir", tmp_path],
                            capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads((tmp_path / "bench.json").read_text())
    (case,) = document["steps"]
    assert case["key"] == "lstm" and set(case["variants"]) == {"a", "d*"}
    assert case["variants"]["d*"]["steps_per_block"] >= 8  # a fused call is an epoch of batches
    (target,) = document["targets"]
    assert target["target"].startswith("Java fused in Python (d*) <= 1.0x eager Python (a)")
    assert target["verdict"] in {MET, MISSED, CANNOT_TELL}


def test_protocol_3_variants_are_judged_beside_torchscripts_on_the_real_shapes():
    quiet = {"ratio": 0.9, "ci95": [0.85, 0.95]}
    results = {"steps": [_case("resnet18", {"a": {}, "d": {"vs_a": quiet}, "d3": {"vs_a": quiet},
                                            "d3*": {"vs_a": {"ratio": 1.3, "ci95": [1.2, 1.4]}}})]}
    verdicts = {t["target"].split(":")[0]: t["verdict"] for t in report.targets(results)}
    assert verdicts == {"Java fused (d) <= 1.0x eager Python (a)": MET,
                        "Java fused, protocol 3 (d3) <= 1.0x eager Python (a)": MET,
                        "Java fused, protocol 3, in Python (d3*) <= 1.0x eager Python (a)": MISSED}


def test_a_model_protocol_3_refuses_is_reported_with_its_reason():
    machine = {"quick": True, "cpus": 2, "torch": torch.__version__, "torch_threads": 2, "rounds": 2,
               "load_average_at_start": [1.0, 1.0, 1.0], "load_average_at_end": [1.0, 1.0, 1.0]}
    case = {**_case("transformer", {}), "parameters": 10, "rounds": 2, "protocol3_refused": "export check failed: x"}
    lines = report.format_tables({"machine": machine, "steps": [case], "targets": [], "answers": []})
    assert "  (d3), (d3*): format='export' refused the model: export check failed: x" in lines


@pytest.mark.gradle
def test_a_tiny_run_times_the_protocol_3_module_beside_the_torchscript_one(tmp_path):
    result = subprocess.run([sys.executable, "-m", "gradbridge", "bench", "--quick", "--cases", "mlp", "--rounds", "2",
                             "--only", "a,d,d3,d3*", "--steps-only", "--out-dir", tmp_path],
                            capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Java -> train_epoch, protocol 3" in result.stdout
    document = json.loads((tmp_path / "bench.json").read_text())
    (case,) = document["steps"]
    assert case["key"] == "mlp" and set(case["variants"]) == {"a", "d", "d3", "d3*"}
    assert case["variants"]["d3"]["steps_per_block"] == case["variants"]["d"]["steps_per_block"]
    assert (tmp_path / "mlp-64-export.pt").exists()
    assert {t["target"].split(":")[0] for t in document["targets"]} >= {
        "Java fused, protocol 3 (d3) <= 1.0x eager Python (a)",
        "Java fused, protocol 3, in Python (d3*) <= 1.0x eager Python (a)"}


def test_the_resnet_case_without_torchvision_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` raises ImportError
    with pytest.raises(cases.SetupError, match="^bench case resnet18 needs the torchvision package"):
        next(case for case in cases.CASES if case.key == "resnet18").build()
