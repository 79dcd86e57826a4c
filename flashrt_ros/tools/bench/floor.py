"""The replan's floor: the least time its batched steps can take on one core of this machine, from what
each batched step must compute and read and the core's measured peaks (the compiled step runs on one core).

Per batched step of B rows over a window of L entries: every row multiplies by every weight once and
attends over L keys and values (2 FLOPs a multiply-add); the weights (at the width the step holds them)
and the window's K and V are read once (rows in lockstep share them). The floor is the roofline's:
max(FLOPs / peak FLOP/s, bytes / bandwidth)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

PEAK_PROBE = """
import json, time
import numpy as np
def best(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return min(times)
n = 384
a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
c = np.empty_like(a)
matmul_s = best(lambda: np.matmul(a, a, out=c), 50)
src = np.ones(16 * 2**20 // 4, np.float32)  # 16 MiB: past L2, as a 4096-step window's K and V are
dst = np.empty_like(src)
copy_s = best(lambda: np.copyto(dst, src), 20)
print(json.dumps({"gflop_per_s": round(2 * n**3 / matmul_s / 1e9, 2),
                  "gbyte_per_s": round(2 * src.nbytes / copy_s / 1e9, 2)}))
"""
ONE_THREAD = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def core_peaks() -> dict:
    """One core's float32 matmul FLOP/s (BLAS, one thread) and copy bandwidth (read + write), best of runs."""
    out = subprocess.run([sys.executable, "-c", PEAK_PROBE], env={**os.environ, **ONE_THREAD},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return {**json.loads(out), "how": "one thread: float32 384x384 matmul, 16 MiB copy; best of runs"}


def replan_floor(branches: int, horizon: int, kv_len: int, d_model: int, n_layers: int, weight_bytes: int,
                 peaks: dict, weight_bytes_read: int | None = None) -> dict:
    """weight_bytes: the float32 weights' (so their count); weight_bytes_read: what a step reads of them (less,
    where matrices are held at 16 bits)."""
    weights = weight_bytes // 4  # float32
    window = 2 * kv_len * d_model * n_layers  # K and V entries read per row
    flops = 2 * branches * (weights + window)
    nbytes = (weight_bytes if weight_bytes_read is None else weight_bytes_read) + 4 * window
    per_step_s = max(flops / (peaks["gflop_per_s"] * 1e9), nbytes / (peaks["gbyte_per_s"] * 1e9))
    return {"flops_per_batched_step": flops, "bytes_per_batched_step": nbytes,
            "floor_ms": round(horizon * per_step_s * 1e3, 3)}
