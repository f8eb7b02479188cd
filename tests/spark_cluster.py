"""A real Spark standalone cluster on 127.0.0.1 for the tests: one master and N one-core workers
started with pip's ``pyspark`` (``spark-class``), free ports chosen by the processes themselves
(``--port 0``), and ``spark-submit`` of gradbridge-spark's submit jar for the cluster's Scala version.
Each process is one this module started and ends by its id.

Which Spark: this venv's ``pyspark`` (the version pinned with ``sparkVersion``), or with
``pytest --spark-lines`` each release of ``sparkClusterVersions`` (gradle.properties), installed on
demand into a venv of its own, ``.venv-spark/<version>`` (pip's cache makes a re-creation cheap).
A pyspark ships Spark's jars for one Scala version (3.5.x: 2.12, 4.x: 2.13); the cluster runs the
gradbridge-spark artifact built for it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from gradbridge._runtime import jdk, native

MAIN = "dev.gradbridge.spark.SparkTrainCommand"
REPO_ROOT = Path(__file__).resolve().parents[1]


def gradle_properties() -> dict:
    text = (REPO_ROOT / "gradle.properties").read_text()
    return dict(re.findall(r"^(\w+)=(\S+)$", text, flags=re.MULTILINE))


def cluster_versions() -> List[str]:
    """The Spark releases of the real-cluster matrix (``--spark-lines``): gradle.properties' sparkClusterVersions."""
    return gradle_properties()["sparkClusterVersions"].split(",")


def scala_of(spark_version: str) -> str:
    """The Scala version of the gradbridge-spark artifact for ``spark_version``: the line it belongs to."""
    props = gradle_properties()
    same_line = spark_version.split(".")[:2] == props["spark35Version"].split(".")[:2]
    return props["spark35ScalaBinaryVersion"] if same_line else props["scalaBinaryVersion"]


def submit_jar_task(scala: str) -> str:
    """The Gradle task that builds the spark-submit jar for ``scala`` (spark/build.gradle)."""
    return ":spark:sparkSubmitJar" if scala == gradle_properties()["scalaBinaryVersion"] \
        else f":spark:sparkSubmitJar_{scala.replace('.', '_')}"


def spark_home(version: Optional[str] = None) -> Path:
    """The Spark of this venv's ``pyspark`` (``version`` None), else of ``.venv-spark/<version>``."""
    if version is None:
        import pyspark

        return Path(pyspark.__file__).parent
    venv = REPO_ROOT / ".venv-spark" / version
    marker = venv / ".installed"
    if not marker.exists():
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one from an interrupted run
        for command in ([sys.executable, "-m", "venv", str(venv)],
                        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"pyspark=={version}"]):
            made = subprocess.run(command, capture_output=True, text=True, check=False)
            if made.returncode != 0:
                raise RuntimeError(f"{' '.join(command)}: exit {made.returncode}\n{made.stderr[-2000:]}")
        marker.write_text(version + "\n")
    found = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; "
                            "print(u.find_spec('pyspark').submodule_search_locations[0])"],
                           capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def spark_jars_version(home: Path) -> tuple:
    """(Spark version, Scala version) of the Spark at ``home``, from its spark-core jar's name."""
    names = [p.name for p in (home / "jars").glob("spark-core_*.jar")]
    found = re.fullmatch(r"spark-core_(\d+\.\d+)-(.+)\.jar", names[0]) if len(names) == 1 else None
    if found is None:
        raise RuntimeError(f"{home / 'jars'}: expected one spark-core_<scala>-<version>.jar, found {names}")
    return found.group(2), found.group(1)


def _environment(home: Path) -> dict:
    java = Path(jdk.checked_java()).resolve()
    return {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
            "JAVA_HOME": str(java.parent.parent), "SPARK_DAEMON_MEMORY": "256m"}


def _wait_for(log: Path, pattern: str, process: subprocess.Popen, timeout: float = 90) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if found:
            return found
        if process.poll() is not None:
            raise RuntimeError(f"{log.name}: the process ended ({process.returncode}):\n{log.read_text()[-2000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{log.name}: no {pattern!r} within {timeout} s:\n{log.read_text()[-2000:]}")


class Cluster:
    """``with Cluster(folder) as cluster: cluster.submit(jar, args)``; ``home``: the Spark (default: this venv's)."""

    def __init__(self, folder: Path, workers: int = 2, home: Optional[Path] = None):
        self.folder = folder
        self.home = home or spark_home()
        self.spark_version, self.scala_version = spark_jars_version(self.home)
        self.workers = workers
        self.processes: List[subprocess.Popen] = []
        self.worker_processes: List[subprocess.Popen] = []
        self.url = ""

    def _start(self, name: str, *args: str) -> tuple:
        log = self.folder / f"{name}.log"
        process = subprocess.Popen([str(self.home / "bin" / "spark-class"), *args], env=_environment(self.home),
                                   stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process, log

    def __enter__(self) -> "Cluster":
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            master, log = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                      "--port", "0", "--webui-port", "0")
            self.url = _wait_for(log, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", master).group(1)
            for i in range(self.workers):
                worker, log = self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url,
                                          "--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--cores", "1",
                                          "--memory", "1536m", "--work-dir", str(self.folder / f"work{i}"))
                self.worker_processes.append(worker)
                _wait_for(log, r"Successfully registered with master", worker)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # its own session: the daemon and its executors
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def submit(self, jar: Path, args: Sequence[object], *, timeout: float = 600) -> subprocess.CompletedProcess:
        """``spark-submit`` of ``jar`` (client mode), driver and executors on this Python's libtorch."""
        jvm_options = " ".join(native.jvm_options())
        command = [str(self.home / "bin" / "spark-submit"), "--master", self.url, "--class", MAIN,
                   "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
                   "--conf", "spark.executor.memory=1g", "--conf", "spark.executor.cores=1",
                   "--conf", f"spark.cores.max={self.workers}", "--conf", "spark.task.maxFailures=4",
                   "--conf", f"spark.executor.extraJavaOptions={jvm_options}", "--driver-java-options", jvm_options,
                   str(jar), *map(str, args)]
        return subprocess.run(command, env=_environment(self.home), capture_output=True, text=True, timeout=timeout,
                              check=False)

    def environment(self) -> dict:
        """The environment its processes and spark-submit run in (its SPARK_HOME, Java, 127.0.0.1)."""
        return _environment(self.home)

    def executor_logs(self) -> List[Path]:
        """The stderr files of the last application's executors (under the workers' work folders)."""
        apps = sorted({p.name for p in self.folder.glob("work*/app-*")})
        return sorted(self.folder.glob(f"work*/{apps[-1]}/*/stderr")) if apps else []
