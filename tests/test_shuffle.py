"""The shared shuffle: Python and Java both reproduce tests/vectors/shuffle.json."""

from __future__ import annotations

import json
from pathlib import Path

import jpype

from gradbridge._runtime import shuffle

VECTORS = json.loads((Path(__file__).parent / "vectors" / "shuffle.json").read_text())


def test_splitmix64_matches_the_reference_outputs():
    generator = shuffle.SplitMix64(int(VECTORS["splitmix64"]["state"]))
    assert [str(generator.next()) for _ in VECTORS["splitmix64"]["outputs"]] == VECTORS["splitmix64"]["outputs"]


def test_python_reproduces_every_case():
    for case in VECTORS["cases"]:
        seed = int(case["seed"])
        assert shuffle.permutation(seed, case["epoch"], case["n"]) == case["permutation"], case
        assert str(shuffle.torch_seed(seed, case["epoch"])) == case["torch_seed"], case


def test_java_reproduces_every_case_in_this_process(jvm):
    Shuffle = jpype.JClass("dev.gradbridge.data.Shuffle")
    Long = jpype.JClass("java.lang.Long")
    for case in VECTORS["cases"]:
        seed = Long.parseUnsignedLong(case["seed"])
        assert list(Shuffle.permutation(seed, case["epoch"], case["n"])) == case["permutation"], case
        assert str(Shuffle.torchSeed(seed, case["epoch"])) == case["torch_seed"], case


def test_permutations_are_permutations_and_differ_by_epoch():
    a, b = shuffle.permutation(7, 0, 50), shuffle.permutation(7, 1, 50)
    assert sorted(a) == list(range(50)) and a != b


def test_step_seeds_match_in_both_languages(jvm):
    """The seed of an online micro-batch or a Spark step and partition (dropout's draws), pinned for both."""
    SeededDraws = jpype.JClass("dev.gradbridge.internal.SeededDraws")
    Long = jpype.JClass("java.lang.Long")
    for case in VECTORS["step_seeds"]:
        seed = int(case["seed"])
        assert str(shuffle.step_seed(seed, *case["ids"])) == case["step_seed"], case
        java = SeededDraws.seed(Long.parseUnsignedLong(case["seed"]), jpype.JArray(jpype.JLong)(case["ids"]))
        assert str(int(java) & ((1 << 64) - 1)) == case["step_seed"], case
