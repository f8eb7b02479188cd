"""The Kafka-fed online learner against the HTTP-fed one: learning throughput and predict latency while it learns.

    .venv/bin/python benchmarks/kafka_online_bench.py [--events 32768] [--rows 32] [--rounds 5]

Starts a broker (tools/kafka_broker.py: Apache Kafka's own jars, KRaft, loopback), exports the online-bench MLP
(16-64-4, Adam) and runs ``dev.gradbridge.serve.KafkaBenchmark`` in a JVM of its own on the service's classpath: in
interleaved rounds, a fresh learner (fsync never, micro-batches of ROWS) fed the topic's records by ``KafkaFeedback``
as gradbridge-serve runs it, and one fed the same JSON bodies by 4 concurrent callers that parse them as ``/feedback``
does (the HTTP path without its socket); two threads predict (one row, a call every 0.5 ms each) meanwhile. Kafka's
rate is given from the service's start (consumer connect, metadata, first fetch included) and from its first logged
read on. Prints the medians over rounds and the per-round ratios, and writes build/online-bench/kafka-bench.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from gradbridge._runtime import classpath, launcher  # noqa: E402
from gradbridge import protocol  # noqa: E402
from gradbridge.bench.online import CLASSES, FEATURES  # noqa: E402
from gradbridge.export import export_builtin  # noqa: E402

_spec = importlib.util.spec_from_file_location("kafka_broker", REPO / "tools" / "kafka_broker.py")
kafka_broker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kafka_broker)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=32768)
    parser.add_argument("--rows", type=int, default=32, help="events per record and per micro-batch")
    parser.add_argument("--feeders", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out-dir", default=str(REPO / "build" / "online-bench"))
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = export_builtin("mlp", out_dir / "bench_mlp.pt", seed=0, in_features=FEATURES, hidden=(64,),
                           out_features=CLASSES, loss={"name": "cross_entropy"}, optimizer={"name": "adam", "lr": 1e-3},
                           inputs=[protocol.tensor_spec("x", [-1, FEATURES], "float32"),
                                   protocol.tensor_spec("y", [-1], "int64")])
    with tempfile.TemporaryDirectory(dir=out_dir) as work:
        broker = Path(work) / "broker"
        kafka_broker.start(broker)
        try:
            line = launcher.command("dev.gradbridge.serve.KafkaBenchmark",
                                    [model, Path(work) / "logs", kafka_broker.bootstrap(broker), "bench-feedback",
                                     args.events, args.rows, args.feeders, args.rounds, 2],
                                    extra_classpath=classpath.resolve_serve())
            result = subprocess.run(line, capture_output=True, text=True, check=False)
        finally:
            kafka_broker.stop(broker)
    if result.returncode != 0:
        print(result.stderr[-3000:], file=sys.stderr)
        return 1
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    (out_dir / "kafka-bench.json").write_text(json.dumps(figures, indent=2))
    r = figures["by_round"]
    ratios = [k / h for k, h in zip(r["kafka_events_per_s"], r["http_json_events_per_s"])]
    print(f"MLP {FEATURES}-64-{CLASSES}, Adam, fsync never, {figures['events']} events as records of "
          f"{figures['rows_per_record']} (micro-batches of as many), {args.rounds} rounds")
    for variant, label in (("http_json", f"JSON bodies, {args.feeders} callers"), ("kafka", "Kafka topic, 3 partitions")):
        rates, p50, p99 = r[f"{variant}_events_per_s"], r[f"{variant}_p50_us"], r[f"{variant}_p99_us"]
        print(f"  {label:<28} {np.median(rates):>9.0f} events/s [{min(rates):.0f}-{max(rates):.0f}]   predict p50 "
              f"{np.median(p50):.0f} us, p99 {np.median(p99):.0f} us [{min(p99):.0f}-{max(p99):.0f}]")
    steady = [k / h for k, h in zip(r["kafka_steady_events_per_s"], r["http_json_events_per_s"])]
    print(f"  kafka after its first read  {np.median(r['kafka_steady_events_per_s']):>9.0f} events/s (the consumer's "
          "start left out)")
    print(f"  kafka / JSON-fed throughput, per round: median {np.median(ratios):.2f}x [{min(ratios):.2f}-"
          f"{max(ratios):.2f}]; after the first read {np.median(steady):.2f}x [{min(steady):.2f}-{max(steady):.2f}] "
          "(target >= 0.8x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
