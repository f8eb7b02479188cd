"""gradbridge-spark on a real standalone cluster: a master and two one-core workers on 127.0.0.1
(pip's pyspark at the pinned sparkVersion, ``tests/spark_cluster.py``), ``spark-submit`` of the
submit jar of the cluster's Scala version, bit for bit against the replay (``reference.train_sharded``).
``--spark-lines`` runs every case on each Spark of ``sparkClusterVersions`` instead (3.5.x on the
``_2.12`` jar, 4.x on the ``_2.13`` one), each from a pyspark in a venv of its own.

Default run: a model of several inputs (a Parquet column per input). ``--full`` adds two epochs on .npz with
one executor killed (SIGKILL) mid-epoch, which also loses the shuffle output and cached partitions it held,
then a resume on Parquet, a normal run whose spark-submit output is warnings plus one line per epoch; Adam,
shuffled and in order; and docs/spark.md's spark-submit walkthrough run as it stands (``--spark-lines`` runs
it on each Spark too).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradbridge import protocol, reference
from gradbridge._runtime import native as gb_native, sparkrun
from gradbridge.export import export_builtin
from gradbridge.history import History
from tests import spark_cluster
from tests.spark_cluster import REPO_ROOT, Cluster
from tests.spark_support import assert_bitwise, recommender_case

BATCH = 32


def pytest_generate_tests(metafunc):
    """--spark-lines: every case once per Spark of the matrix (one cluster at a time)."""
    if "spark_release" in metafunc.fixturenames and metafunc.config.getoption("--spark-lines"):
        versions = spark_cluster.cluster_versions()
        metafunc.parametrize("spark_release", versions, ids=[f"spark-{v}" for v in versions], scope="module")


@pytest.fixture(scope="module")
def spark_release():
    """The Spark the cluster runs: None, this venv's pyspark (without --spark-lines)."""
    return None


@pytest.fixture(scope="module")
def spark_home(spark_release):
    return spark_cluster.spark_home(spark_release)


@pytest.fixture(scope="module")
def jar(spark_home):
    """The submit jar of the cluster's Scala version (gradbridge-spark-submit_2.12 for Spark 3.5, _2.13 for 4.x)."""
    from gradbridge._runtime import devtree as _devtree
    from gradbridge._runtime.gradle import run_task

    scala = spark_cluster.spark_jars_version(spark_home)[1]
    built = run_task(spark_cluster.submit_jar_task(scala))
    assert built.returncode == 0, built.stderr[-3000:]
    libs = _devtree.require_root("the submit jar") / "spark" / "build" / "libs"
    return next(libs.glob(f"gradbridge-spark-submit_{scala}-*.jar"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, spark_home, spark_release):
    with Cluster(tmp_path_factory.mktemp("cluster"), home=spark_home) as running:
        if spark_release is not None:  # pip's pyspark of that version, with Spark's jars of that line's Scala
            expected = (spark_release, spark_cluster.scala_of(spark_release))
            assert (running.spark_version, running.scala_version) == expected
        yield running


@pytest.fixture(autouse=True)
def _ran_on(request, cluster):
    """Names the Spark each case ran on, for the summary table (tests/conftest.py)."""
    request.node.user_properties.append(("spark_cluster", (cluster.spark_version, cluster.scala_version)))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster-data")
    inputs = [protocol.tensor_spec("x", [-1, 4], "float32"), protocol.tensor_spec("y", [-1], "int64")]
    models = {name: export_builtin("mlp", folder / f"mlp_{name}.pt", seed=0, in_features=4, hidden=(16,),
                                   out_features=3, loss={"name": "cross_entropy"}, optimizer=spec, inputs=inputs)
              for name, spec in {"sgd": {"name": "sgd", "lr": 0.1}, "adam": {"name": "adam", "lr": 0.01}}.items()}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4)).astype(np.float32)
    y = rng.integers(0, 3, 200).astype(np.int64)
    np.savez(folder / "data.npz", x=x, y=y)
    several = recommender_case(folder)  # a model of several inputs and its data
    sparkrun.to_parquet([(folder / "data.npz", folder / "data.parquet"), (several["npz"], several["parquet"])])
    return {"folder": folder, "models": models, "x": x, "y": y, "several": several}


def submit(cluster, jar, tmp_path, *args):
    history, stats = tmp_path / "h.jsonl", tmp_path / "stats.json"
    result = cluster.submit(jar, ["--partitions", 2, "--history", history, "--stats", stats, *args])
    assert result.returncode == 0, result.stderr[-4000:]
    return result, History.load(history), json.loads(stats.read_text())


@pytest.mark.slow  # CI's time: --full (one fast case of its kind stays in the default run)
def test_a_killed_executor_then_a_resume_equal_the_replay(cluster, jar, work, tmp_path):
    checkpoint = work["folder"] / "run.pt"
    first = tmp_path / "first"
    first.mkdir()
    _, history, stats = submit(cluster, jar, first, "--model", work["models"]["sgd"], "--data",
                               work["folder"] / "data.npz", "--epochs", 2, "--batch-size", BATCH,
                               "--checkpoint", checkpoint, "--inject-fault", "kill@1:3:1")
    replay = reference.train_sharded(work["models"]["sgd"], work["x"], work["y"], epochs=3, shards=2,
                                     batch_size=BATCH)
    assert_bitwise(history, replay[:2])
    assert stats["stages_retried"] >= 1, stats
    # one stage for the run: the retry started from the end of epoch 0 the driver held, so the attempt
    # that succeeded took epoch 1's steps only
    assert stats["steps"] == -(-len(work["x"]) // BATCH), stats
    # the retried epoch runs on two executors again: the killed one's replacement took its partition
    last = stats["executors"][-1]
    assert len(set(last)) == 2 and len(set(stats["executors"][0]) | set(last)) == 3, stats

    second = tmp_path / "second"
    second.mkdir()
    result, resumed, stats = submit(cluster, jar, second, "--resume", checkpoint, "--data",
                                    work["folder"] / "data.parquet", "--epochs", 1)
    assert_bitwise(resumed, replay[2:])
    assert stats["stages_retried"] == 0
    # quiet: warnings on stderr, no error; the only INFO lines are Spark 4's three logs as its context
    # starts, before spark.log.level applies (QuietLogging; Spark 3.5 prints none); one line per epoch on stdout
    lines = result.stderr.splitlines()
    assert not [line for line in lines if " ERROR " in line], result.stderr
    starts = [] if cluster.spark_version.startswith("3.") else ["SparkContext"] * 3
    assert [line.split(" INFO ")[1].split(":")[0] for line in lines if " INFO " in line] == starts, result.stderr
    # nor at the executors' normal end (their workers stop them with SIGTERM)
    logs = cluster.executor_logs()
    assert len(logs) == 2 and not [log for log in logs if " ERROR " in log.read_text(errors="replace")], \
        [log.read_text()[-2000:] for log in logs]
    assert [line for line in result.stdout.splitlines() if line.startswith("epoch ")] == \
        [f"epoch 2: loss {resumed[0].loss:.6g}"]


def test_a_model_of_several_inputs_on_parquet_equals_the_users_model(cluster, jar, work, tmp_path):
    """The recommender's user, item and context as columns of their own: two epochs, bitwise the replay on
    the user's eager nn.Module."""
    several = work["several"]
    _, history, stats = submit(cluster, jar, tmp_path, "--model", several["path"], "--data", several["parquet"],
                               "--epochs", 2, "--batch-size", 16)
    assert_bitwise(history, reference.train_sharded(several["path"], several["x"], several["y"], epochs=2, shards=2,
                                                    batch_size=16, model=several["model"]))
    assert len(set(stats["executors"][0])) == 2, stats


@pytest.fixture
def full_only(request):
    if not request.config.getoption("--full"):
        pytest.skip("runs with --full")


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "ordered"])
def test_adam_on_the_cluster_equals_the_replay(cluster, jar, work, tmp_path, full_only, shuffle):
    _, history, _ = submit(cluster, jar, tmp_path, "--model", work["models"]["adam"], "--data",
                           work["folder"] / "data.parquet", "--epochs", 2,
                           "--shuffle" if shuffle else "--no-shuffle")
    assert_bitwise(history, reference.train_sharded(work["models"]["adam"], work["x"], work["y"], epochs=2,
                                                    shards=2, batch_size=BATCH, shuffle=shuffle))


def _docs_walkthrough() -> str:
    """The marked block of docs/spark.md, as it stands."""
    text = (REPO_ROOT / "docs" / "spark.md").read_text()
    return re.search(r"```bash\n(.*?)```", text[text.index("<!-- walkthrough"):], re.DOTALL).group(1)


def test_the_docs_walkthrough_equals_the_replay(cluster, jar, tmp_path, request):
    """docs/spark.md's spark-submit walkthrough, run as shown in an empty folder against the cluster:
    export, data, Parquet, two epochs, a resume, its own replay check (gradbridge parity of each history, which
    fails the block unless bitwise). The cluster's spark-defaults.conf
    holds what an administrator sets (the driver's address, this Python's libtorch on both sides).
    Under --spark-lines on each Spark of the matrix; on the pinned Spark with --full (~1-2 min)."""
    if not (request.config.getoption("--spark-lines") or request.config.getoption("--full")):
        pytest.skip("runs with --full or --spark-lines")
    conf = tmp_path / "conf"
    conf.mkdir()
    libtorch = " ".join(gb_native.jvm_options())
    (conf / "spark-defaults.conf").write_text("\n".join([
        "spark.driver.host 127.0.0.1", "spark.driver.bindAddress 127.0.0.1", "spark.executor.memory 1g",
        f"spark.driver.extraJavaOptions {libtorch}", f"spark.executor.extraJavaOptions {libtorch}", ""]))
    folder = tmp_path / "walkthrough"
    folder.mkdir()
    path = os.pathsep.join([str(cluster.home / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {**cluster.environment(), "SPARK_CONF_DIR": str(conf), "PATH": path, "MASTER": cluster.url,
           "JARS": str(jar.parent)}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", _docs_walkthrough()], cwd=folder, env=env,
                            capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    verdicts = [line for line in result.stdout.splitlines()  # gradbridge parity's last lines, not the runs' counts
                if re.match(r"spark: (bitwise|within|diverged|nothing)", line)]
    assert verdicts == ["spark: bitwise identical over 2 epochs", "spark: bitwise identical over 1 epochs"], \
        result.stdout + result.stderr[-4000:]
    assert result.stdout.count("replaying on 1 intra-op thread, as the Spark tasks ran") == 2, result.stdout
    data = np.load(folder / "train.npz")
    replay = reference.train_sharded(folder / "my_net.pt", data["x"], data["y"], epochs=3, shards=2, batch_size=32)
    assert_bitwise(list(History.load(folder / "h.jsonl")) + list(History.load(folder / "resumed.jsonl")), replay)
