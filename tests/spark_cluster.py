"""A real Spark standalone cluster on 127.0.0.1 for the tests: one master and N one-core workers
started with pip's ``pyspark`` (``spark-class``, the version pinned with ``sparkVersion``), free ports
chosen by the processes themselves (``--port 0``), and ``spark-submit`` of gradbridge-spark's submit
jar. Each process is one this module started and ends by its id."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import List, Sequence

from gradbridge import jdk, libtorch

MAIN = "dev.gradbridge.spark.SparkTrainCommand"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _environment() -> dict:
    java = Path(jdk.checked_java()).resolve()
    return {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
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
    """``with Cluster(folder) as cluster: cluster.submit(jar, args)``."""

    def __init__(self, folder: Path, workers: int = 2):
        self.folder = folder
        self.workers = workers
        self.processes: List[subprocess.Popen] = []
        self.worker_processes: List[subprocess.Popen] = []
        self.url = ""

    def _start(self, name: str, *args: str) -> tuple:
        log = self.folder / f"{name}.log"
        process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=_environment(),
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
        djl = " ".join(libtorch.java_options(use_torch_lib=True))
        command = [str(spark_home() / "bin" / "spark-submit"), "--master", self.url, "--class", MAIN,
                   "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
                   "--conf", "spark.executor.memory=1g", "--conf", "spark.executor.cores=1",
                   "--conf", f"spark.cores.max={self.workers}", "--conf", "spark.task.maxFailures=4",
                   "--conf", f"spark.executor.extraJavaOptions={djl}", "--driver-java-options", djl,
                   str(jar), *map(str, args)]
        return subprocess.run(command, env=_environment(), capture_output=True, text=True, timeout=timeout,
                              check=False)

    def executor_logs(self) -> List[Path]:
        """The stderr files of the last application's executors (under the workers' work folders)."""
        apps = sorted({p.name for p in self.folder.glob("work*/app-*")})
        return sorted(self.folder.glob(f"work*/{apps[-1]}/*/stderr")) if apps else []
