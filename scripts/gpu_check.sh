#!/usr/bin/env bash
# The one GPU check (`make gpu-check`): the gpu-marked tests, then `flashrt-bench gpu` and
# `flashrt-bench runtime --backend cuda`. Each part has its own time limit, so one that hangs or fails
# still leaves the others' results. Logs and JSON go to $OUT (default out/gpu-check).
# Needs python3 with cupy, numpy, numba, pytest, hypothesis, PyYAML, safetensors; no ROS, no .venv.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu-check}
PY=${GPU_PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/build/numba-cache}
rc=0

part() {  # part NAME LIMIT_S CMD...: run, log to $OUT/NAME.log, keep the worst exit status
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%T), limit ${limit}s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" > >(tee "$OUT/$name.log") 2>&1
    local r=$?
    echo "== $name: exit $r after $((SECONDS - t0)) s"
    [ "$r" -ne 0 ] && rc=$r
}

part env 30 bash -c "nvidia-smi -L; nproc; uptime; $PY -c 'import sys, numpy, cupy, numba; \
print(sys.version.split()[0], \"numpy\", numpy.__version__, \"cupy\", cupy.__version__, \"numba\", numba.__version__)'"
part gpu_tests 180 "$PY" -m pytest -q -rfE --tb=long -m gpu test/test_gpu.py test/test_bench.py
part bench_gpu 150 "$PY" -m flashrt_ros.tools.bench gpu --json "$OUT/bench_gpu.json"
part bench_runtime_cuda 200 "$PY" -m flashrt_ros.tools.bench runtime --backend cuda \
    --json "$OUT/bench_runtime_cuda.json"
echo "== gpu-check: exit $rc"
exit "$rc"
