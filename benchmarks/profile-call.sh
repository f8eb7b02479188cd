#!/bin/bash
# Where one training call's CPU time goes: flat perf profiles (999 Hz, 8 s of steady state) of the
# seed model's train_step in a loop, in the native loop and in a JVM of its own, by library.
#
#   benchmarks/profile-call.sh [OUT_DIR]        (needs perf, a Java build, and the project's Python)
#
# Run `gradbridge bench --steps-only --cases seed --only e` once first: it builds the native loop.
# Dividing libtorch_cpu.so's share of the native profile by its share of the Java profile gives the
# CPU time of one Java call against one native call (benchmarks/history/README.md has such a table).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/profile-call}
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
NATIVE=${NATIVE:-build/bench-native/torch$("$PYTHON" -c "import torch; print(torch.__version__)")/train_loop}
[ -x "$NATIVE" ] || { echo "no native loop at $NATIVE: run gradbridge bench first" >&2; exit 1; }
"$PYTHON" - "$OUT" <<'EOF'
import sys
from pathlib import Path
import numpy as np
from gradbridge import libtorch, classpath
from gradbridge.bench import cases, workers
out = Path(sys.argv[1])
case = cases.CASES[0]
model, path = cases._export(case, out)
x, y = cases._data(case, case.batch)
np.savez(out / "batch.npz", x=x, y=y)
workers._write_native_data(out / "batch.bin", x, y)
(out / "java-options").write_text(" ".join(libtorch.java_options()))
(out / "classpath").write_text(":".join(classpath.resolve().entries))
EOF
MODEL="$OUT/seed-100.pt"
profile() {  # NAME COMMAND...: run a worker for 1,000,000 calls, record 8 s after 8 s of warm-up
  local name=$1; shift
  (echo "run 1000000"; sleep 30) | "$@" > "$OUT/$name.out" 2>&1 &
  local feeder=$!
  sleep 8
  local pid
  pid=$(pgrep -n -f "$MODEL")
  perf record -q -F 999 -p "$pid" -o "$OUT/$name.data" -- sleep 8 > /dev/null 2>&1
  kill "$pid" 2> /dev/null || true
  wait "$feeder" 2> /dev/null || true
  echo "== $name"
  perf report -i "$OUT/$name.data" --no-children --sort dso --stdio 2> /dev/null | grep "%" | head -10
}
profile native "$NATIVE" "$MODEL" "$OUT/batch.bin" step 2 100
# shellcheck disable=SC2046
profile java java $(cat "$OUT/java-options") -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
  -Dgradbridge.numThreads=2 -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit \
  -cp "$(cat "$OUT/classpath")" dev.gradbridge.bench.StepBenchmark "$MODEL" "$OUT/batch.npz" step 100
