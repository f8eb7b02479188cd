#!/usr/bin/env python3
"""A real Apache Kafka broker (KRaft, one node) on loopback, from Kafka's own jars on Maven Central.

Gradle fetches the jars (`gradle :serve:kafkaBrokerClasspath` writes serve/build/kafka/broker-classpath.txt);
this script formats a storage folder, starts `kafka.Kafka` on 127.0.0.1 at a free port (or the one given),
waits until it answers, and stops it by the PID it wrote. The tests (tests/kafka_support.py) import
it; the README's walkthrough runs it:

    python3 tools/kafka_broker.py start build/kafka-demo        # prints the bootstrap address
    python3 tools/kafka_broker.py topic build/kafka-demo feedback --partitions 3
    python3 tools/kafka_broker.py produce build/kafka-demo feedback < events.tsv   # KEY<TAB>JSON per line
    python3 tools/kafka_broker.py stop build/kafka-demo

Standard library only. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CLASSPATH_FILE = REPO_ROOT / "serve" / "build" / "kafka" / "broker-classpath.txt"
HEAP = ["-Xms128m", "-Xmx512m"]
TOOL_HEAP = ["-Xms32m", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]


class BrokerError(RuntimeError):
    """One line: what went wrong with the broker."""


def classpath() -> str:
    """The broker's jars (Gradle fetches them when the list is missing)."""
    if not CLASSPATH_FILE.is_file():
        result = subprocess.run(["gradle", "--no-daemon", "-q", ":serve:kafkaBrokerClasspath"], cwd=REPO_ROOT,
                                capture_output=True, text=True)
        if result.returncode != 0 or not CLASSPATH_FILE.is_file():
            tail = [line for line in result.stderr.splitlines() if line.strip() and "openjdk" not in line.lower()]
            raise BrokerError("cannot fetch Apache Kafka's jars (gradle :serve:kafkaBrokerClasspath): "
                              + (tail[-1] if tail else f"exit {result.returncode}"))
    return CLASSPATH_FILE.read_text().strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def bootstrap(folder) -> str:
    """host:port of the broker started in ``folder``."""
    return f"127.0.0.1:{(Path(folder) / 'port').read_text().strip()}"


def start(folder, port: int = 0, timeout: float = 90.0) -> str:
    """Formats ``folder``/data once, starts the broker and waits until it serves; returns host:port.

    A folder that was formatted before keeps its data (a broker restart)."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if is_running(folder):
        raise BrokerError(f"a broker from {folder} is already running (pid {(folder / 'broker.pid').read_text().strip()})")
    cp = classpath()
    data = folder / "data"
    config = folder / "server.properties"
    if port == 0 and (folder / "port").is_file() and data.is_dir():
        port = int((folder / "port").read_text())  # a restart keeps its address
    port = port or free_port()
    controller = free_port()
    config.write_text("\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={data}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "num.network.threads=2",
        "num.io.threads=2",
        "background.threads=2",
        "log.flush.interval.messages=1",  # every record durable on disk: the broker restart test loses nothing
        "",
    ]))
    log = open(folder / "broker.out", "ab")
    if not (data / "meta.properties").is_file():
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        result = subprocess.run([_java(), *TOOL_HEAP, "-cp", cp, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}",
                                 "-c", str(config)], stdout=log, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            raise BrokerError(f"kafka-storage format failed (exit {result.returncode}); see {folder / 'broker.out'}")
    process = subprocess.Popen([_java(), *HEAP, "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true", "-cp", cp,
                                "kafka.Kafka", str(config)], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    (folder / "broker.pid").write_text(f"{process.pid}\n")
    (folder / "port").write_text(f"{port}\n")
    deadline = time.monotonic() + timeout
    while not _answers(port):
        if process.poll() is not None:
            raise BrokerError(f"the Kafka broker exited with {process.returncode}; see {folder / 'broker.out'}")
        if time.monotonic() > deadline:
            stop(folder)
            raise BrokerError(f"the Kafka broker did not listen on 127.0.0.1:{port} within {timeout:.0f} s")
        time.sleep(0.2)
    return f"127.0.0.1:{port}"


def _pid(folder) -> int | None:
    try:
        return int((Path(folder) / "broker.pid").read_text())
    except (OSError, ValueError):
        return None


def is_running(folder) -> bool:
    pid = _pid(folder)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a PID reused by another program is not our broker
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop(folder, kill: bool = False, timeout: float = 30.0) -> None:
    """Stops the broker started in ``folder`` by its PID (SIGTERM, SIGKILL after ``timeout`` or with ``kill``)."""
    pid = _pid(folder)
    if pid is None or not is_running(folder):
        return
    os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while is_running(folder):
        try:  # our child: reap it so that it does not linger as a zombie
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break
        except ChildProcessError:
            pass
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
        time.sleep(0.1)
    (Path(folder) / "broker.pid").unlink(missing_ok=True)


def tool(folder, main: str, *args: str, stdin: bytes | None = None) -> str:
    """Runs one of Kafka's own tools (kafka-tools) against the broker; returns its stdout."""
    result = subprocess.run([_java(), *TOOL_HEAP, "-cp", classpath(), main, "--bootstrap-server", bootstrap(folder),
                             *args], input=stdin, capture_output=True)
    if result.returncode != 0:
        lines = [line for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]
        raise BrokerError(f"{main.rsplit('.', 1)[-1]} failed: " + (lines[-1] if lines else f"exit {result.returncode}"))
    return result.stdout.decode()


def create_topic(folder, topic: str, partitions: int = 1) -> None:
    tool(folder, "org.apache.kafka.tools.TopicCommand", "--create", "--topic", topic, "--partitions", str(partitions),
         "--replication-factor", "1")


def produce(folder, topic: str, records) -> None:
    """Appends ``records`` ((key, value) text pairs; key None for none) with Kafka's console producer:
    the default partitioner places a keyed record by its key's hash, deterministically."""
    lines = []
    for key, value in records:
        if "\t" in (key or "") or "\n" in value or "\n" in (key or ""):
            raise BrokerError("produce: keys and values are one line each, keys without tabs")
        lines.append(f"{key if key is not None else 'null'}\t{value}")
    tool(folder, "org.apache.kafka.tools.ConsoleProducer", "--topic", topic,
         "--property", "parse.key=true", "--property", "key.separator=\t", "--property", "null.marker=null",
         "--producer-property", "acks=all", "--producer-property", "linger.ms=5",
         stdin=("\n".join(lines) + "\n").encode())


def end_offsets(folder, topic: str) -> dict:
    """{partition: end offset} of ``topic``."""
    out = tool(folder, "org.apache.kafka.tools.GetOffsetShell", "--topic", topic)
    offsets = {}
    for line in out.split():
        _, partition, offset = line.rsplit(":", 2)
        offsets[int(partition)] = int(offset)
    return offsets


def committed_offsets(folder, group: str, topic: str) -> dict:
    """{partition: offset} that consumer group ``group`` committed for ``topic`` (partitions it never committed left out)."""
    out = tool(folder, "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", "--describe", "--group", group)
    offsets = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] == group and fields[1] == topic and fields[3].isdigit():
            offsets[int(fields[2])] = int(fields[3])
    return offsets


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kafka_broker.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", help="format (once) and start a broker; prints host:port")
    p.add_argument("folder")
    p.add_argument("--port", type=int, default=0)
    p = sub.add_parser("stop", help="stop the broker started in FOLDER")
    p.add_argument("folder")
    p = sub.add_parser("topic", help="create a topic")
    p.add_argument("folder")
    p.add_argument("topic")
    p.add_argument("--partitions", type=int, default=1)
    p = sub.add_parser("produce", help="append KEY<TAB>VALUE lines from stdin ('null' for no key)")
    p.add_argument("folder")
    p.add_argument("topic")
    p = sub.add_parser("offsets", help="print each partition's end offset")
    p.add_argument("folder")
    p.add_argument("topic")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            print(start(args.folder, args.port))
        elif args.command == "stop":
            stop(args.folder)
        elif args.command == "topic":
            create_topic(args.folder, args.topic, args.partitions)
        elif args.command == "produce":
            records = []
            for line in sys.stdin.read().splitlines():
                if line.strip():
                    key, _, value = line.partition("\t")
                    records.append((None if key == "null" else key, value))
            produce(args.folder, args.topic, records)
        elif args.command == "offsets":
            for partition, offset in sorted(end_offsets(args.folder, args.topic).items()):
                print(f"{partition}\t{offset}")
    except (BrokerError, OSError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
