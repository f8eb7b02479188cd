#!/usr/bin/env bash
# Issue 49's device check in one run on a GPU machine (see usage below and docs/testing.md).
set -uo pipefail

usage() {
    cat <<'EOF'
usage: tools/gpu_check.sh [--prepare | --rehearse] [--python PY] [--no-tests] [--no-bench] [--help]

On a GPU machine with this checkout (nothing is fetched there: torch, numpy and pytest come from its
Python; Java, the Java library's jars and JPype from .gpu-carry/ where it lacks them), in about 8
minutes: builds gradbridge's native library for that torch, runs the tests marked cuda
(tests/test_cuda.py: the seed model, an MLP with dropout, BERT with its attention mask and ResNet-18 with
BatchNorm trained on cuda:0 by eager PyTorch and by Java, in this process and in a JVM of its own, both
formats; checkpoints between the GPU and the CPU) and the step benchmark (tools/gpu_bench.py: Java's
step and fused epoch against eager on the same GPU, ResNet-18 and a transformer encoder), then prints one
table. Exit code 0 only when every part passed.

  --prepare    on a machine with the venv, JDK 17 and `gradle assemble installDist` done: write
               .gpu-carry/ (a JDK runtime with its JNI headers, the Java library's jars without the
               pytorch-native jar, the generated JNI header, a JPype wheel for Python 3.12) for a GPU
               machine without them; it travels with the checkout (the device tool's carry: .gpu-carry)
  --rehearse   on a machine without a GPU, after --prepare: every part on the CPU, with .gpu-carry's JDK,
               jars and JNI header even where others are installed (GRADBRIDGE_CUDA_TESTS_ON=cpu), to
               check the script before a GPU machine's minutes are spent; nothing about CUDA is checked
  --python PY  the Python whose torch runs the check (default: python3, else .venv/bin/python)
  --no-tests   leave out the cuda tests
  --no-bench   leave out the benchmark
  --help       this text
EOF
}

die() {
    echo "gpu_check.sh: error: $*" >&2
    exit 1
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.gpu-carry"
PREPARE=0 REHEARSE=0 TESTS=1 BENCH=1 PY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --help|-h) usage; exit 0 ;;
        --prepare) PREPARE=1 ;;
        --rehearse) REHEARSE=1 ;;
        --python) [ $# -ge 2 ] || { echo "gpu_check.sh: error: --python needs a value (see --help)" >&2; exit 2; }
                  PY="$2"; shift ;;
        --no-tests) TESTS=0 ;;
        --no-bench) BENCH=0 ;;
        *) echo "gpu_check.sh: error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
cd "$ROOT" || exit 1

# ---- --prepare: what a GPU machine without Java, the jars or JPype needs, into .gpu-carry/ ----
prepare() {
    local venv="$ROOT/.venv/bin/python" lib="$ROOT/build/install/gradbridge/lib"
    local header="$ROOT/build/native/include/dev_gradbridge_Native.h"
    [ -x "$venv" ] || die "no .venv: run make setup first"
    [ -d "$lib" ] && [ -f "$header" ] || die "no Java build: run gradle assemble installDist first"
    local java_home="${JAVA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v javac || echo /nonexistent)")")")}"
    [ -x "$java_home/bin/jlink" ] && [ -d "$java_home/jmods" ] || die "no JDK with jlink and jmods (set JAVA_HOME)"
    rm -rf "$CARRY" && mkdir -p "$CARRY/jars" "$CARRY/include" "$CARRY/wheels" || die "cannot write $CARRY"
    local jar
    for jar in "$lib"/*.jar; do
        case "$(basename "$jar")" in pytorch-native-*) ;; *) cp "$jar" "$CARRY/jars/" ;; esac
    done
    cp "$header" "$CARRY/include/"
    # the modules each jar uses (jdeps, jar by jar: the modular ones fail alone and bring nothing more), and
    # those JPype and the JVM's own tools need
    local modules="java.base,java.logging,java.management,jdk.unsupported,java.sql,java.naming" used
    for jar in "$CARRY"/jars/*.jar; do
        used="$("$java_home/bin/jdeps" --ignore-missing-deps --print-module-deps --multi-release 17 \
            -cp "$CARRY/jars/*" "$jar" 2>/dev/null | tail -1)"
        [[ "$used" =~ ^(java|jdk)\.[a-z.,]+$ ]] && modules="$modules,$used"
    done
    modules="$(tr ',' '\n' <<<"$modules" | sort -u | paste -sd,)"
    "$java_home/bin/jlink" --add-modules "$modules" --strip-debug --no-man-pages --compress=2 \
        --output "$CARRY/jdk" || die "jlink failed"
    "$venv" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$CARRY/wheels" \
        "$(grep -i '^JPype1' "$ROOT/python/gradbridge/requirements.txt")" || die "pip download of JPype1 failed"
    echo "wrote $CARRY ($(du -sh "$CARRY" | cut -f1)): carry .gpu-carry with the checkout to the GPU machine"
}

if [ "$PREPARE" = 1 ]; then
    prepare
    exit 0
fi

# ---- the check, on a GPU machine ----
STARTED=$SECONDS
if [ -z "$PY" ]; then
    if command -v python3 >/dev/null && python3 -c 'import torch' 2>/dev/null; then PY=python3
    elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
    else die "no Python with torch: pass --python PY"; fi
fi
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch"
DEVICE=cuda:0 BENCH_ARGS=()
if [ "$REHEARSE" = 1 ]; then
    [ -x "$CARRY/jdk/bin/java" ] || die "nothing to rehearse with: run tools/gpu_check.sh --prepare first"
    DEVICE=cpu BENCH_ARGS=(--device cpu --rounds 1 --steps 2)
    export GRADBRIDGE_CUDA_TESTS_ON=cpu
else
    COUNT="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.version.cuda else 0)' 2>/dev/null)"
    [ "${COUNT:-0}" -gt 0 ] 2>/dev/null || die "no CUDA device: torch $("$PY" -c 'import torch; print(torch.__version__)') \
sees none here; run this on a GPU machine"
fi

WORK="${GPU_CHECK_WORK:-/tmp/gradbridge-gpu-check}"
mkdir -p "$WORK" || die "cannot write $WORK"
export GRADBRIDGE_CACHE_DIR="$WORK/cache" PYTHONUNBUFFERED=1
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"  # before anything starts CUDA
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

if [ -x "$CARRY/jdk/bin/java" ] && { [ "$REHEARSE" = 1 ] || ! command -v java >/dev/null; }; then
    export JAVA_HOME="$CARRY/jdk" PATH="$CARRY/jdk/bin:$PATH"
fi
command -v java >/dev/null || die "no Java: run tools/gpu_check.sh --prepare where the build is, and carry .gpu-carry"
if [ "$REHEARSE" = 1 ] || { [ ! -f "$ROOT/build/gradbridge-classpath.txt" ] && [ -z "${GRADBRIDGE_CLASSPATH:-}" ]; }; then
    [ -d "$CARRY/jars" ] || die "no Java library: build it (gradle assemble) or carry .gpu-carry (--prepare)"
    GRADBRIDGE_CLASSPATH="$(ls "$CARRY"/jars/*.jar | paste -sd:)"
    export GRADBRIDGE_CLASSPATH
fi
if ! "$PY" -c 'import jpype' 2>/dev/null; then
    [ -d "$CARRY/wheels" ] || die "$PY has no JPype: carry .gpu-carry (--prepare)"
    "$PY" -m pip install --quiet --no-index --no-deps --no-compile --target "$WORK/site" "$CARRY"/wheels/*.whl \
        || die "installing the carried JPype wheel failed"
    export PYTHONPATH="$PYTHONPATH:$WORK/site"
fi
if { [ "$REHEARSE" = 1 ] || ! command -v javac >/dev/null; } && [ -f "$CARRY/include/dev_gradbridge_Native.h" ]; then
    # no javac to generate the JNI header: the carried one, made from this checkout's Native.java
    mkdir -p "$ROOT/build/native/include" && cp "$CARRY/include/dev_gradbridge_Native.h" "$ROOT/build/native/include/"
    touch "$ROOT/build/native/include/dev_gradbridge_Native.h"
fi

FAILED=()
part() {  # part NAME COMMAND...: runs it, says how long it took
    local name="$1" began=$SECONDS
    shift
    echo "== $name"
    if "$@"; then echo "== $name: ok ($((SECONDS - began)) s)"; else FAILED+=("$name"); echo "== $name: FAILED ($((SECONDS - began)) s)"; fi
}

# built once into the cache, where every JVM of the check takes it from
part "native library for this torch" "$PY" -c 'from gradbridge._runtime import native; print(native.ensure())'
part "doctor" bash -c "\"$PY\" -m gradbridge doctor || true"  # a machine without gradle's build has problems it lists
if [ "$TESTS" = 1 ]; then
    PLUGIN=()
    "$PY" -c 'import importlib.metadata as m, sys; sys.exit(0 if any(e.name == "gradbridge" for e in m.entry_points(group="pytest11")) else 1)' \
        || PLUGIN=(-p gradbridge.pytest_plugin)
    part "tests marked cuda" "$PY" -m pytest "${PLUGIN[@]}" -p no:cacheprovider -q -rs tests/test_cuda.py
fi
if [ "$BENCH" = 1 ]; then
    part "step benchmark" "$PY" "$ROOT/tools/gpu_bench.py" "${BENCH_ARGS[@]}" --out "$WORK/bench.txt"
fi

echo
echo "==== gradbridge on $DEVICE: $("$PY" -c 'import sys, torch; print(torch.cuda.get_device_name(0) if sys.argv[1] != "cpu" else "a rehearsal on the CPU", "- torch", torch.__version__)' "$DEVICE") ($((SECONDS - STARTED)) s)"
[ -f "$ROOT/build/cuda-parity.txt" ] && [ "$TESTS" = 1 ] && cat "$ROOT/build/cuda-parity.txt"
[ -f "$WORK/bench.txt" ] && [ "$BENCH" = 1 ] && { echo; cat "$WORK/bench.txt"; }
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu_check.sh: error: failed: ${FAILED[*]}" >&2
    exit 1
fi
echo "every part passed"
