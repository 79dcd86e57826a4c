"""`flashrt-bench gpu`: CUDA graph replay vs eager per-op launches, and capsule copy bandwidth vs a raw
CuPy device-to-device copy of the same bytes. GPU time from CUDA events on the runtime stream."""
from __future__ import annotations

import numpy as np

from ..runtime import PolicyConfig, Session
from .common import p50_p99, progress, synthetic_trace


def _gpu_ms(s: Session, fn, reps: int) -> float:
    cp, st = s.backend.xp, s.backend.stream
    for _ in range(5):
        fn()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(st)
    for _ in range(reps):
        fn()
    b.record(st)
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / reps


def point(kv_window: int) -> dict:
    progress(f"kv_window {kv_window}: graph vs eager, snapshot vs raw copy")
    cfg = PolicyConfig(kv_window=kv_window, capsule_capacity=8, capsule_budget_mb=1e6)
    s = Session(cfg, "cuda")
    obs = synthetic_trace(400, cfg.obs_dim)
    lat = [s.step(o).latency_ms for o in obs[:300]]
    graph = _gpu_ms(s, s._live.replay, 500)
    eager = _gpu_ms(s, s._live.replay_eager, 500)
    row, slot = s.live_row(), s.store.slots[0]
    snap = _gpu_ms(s, lambda: s.backend.copy(slot, row), 200)
    restore = _gpu_ms(s, lambda: s.backend.copy(row, slot), 200)

    def raw_copy():
        with s.backend.stream:
            slot[...] = row

    raw = _gpu_ms(s, raw_copy, 200)
    base = s.store.pin(s.live_capsule_id).id
    branches = np.stack([obs[300:308] + 0.1 * b for b in range(4)]).astype(np.float32)
    replan = []
    for _ in range(50):
        r = s.replan(base, branches, deadline_ms=1e9)
        replan.append(r.elapsed_ms)
        for cid in r.branch_capsule_ids:
            s.store.drop(cid)
    gb = row.nbytes / 1e6
    return {"kv_window": kv_window, "state_bytes": int(row.nbytes),
            "graph_step_ms": round(graph, 4), "eager_step_ms": round(eager, 4),
            "graph_speedup_vs_eager": round(eager / graph, 2),
            "snapshot_ms": round(snap, 4), "restore_ms": round(restore, 4), "raw_copy_ms": round(raw, 4),
            "snapshot_GBps": round(gb / snap, 1), "raw_copy_GBps": round(gb / raw, 1),
            "snapshot_vs_raw": round(raw / snap, 3),
            "step_latency_ms": p50_p99(lat[20:]), "replan_4x8_ms": p50_p99(replan)}


def run(args) -> dict:
    from ..runtime.backend import cuda_probe

    why_not = cuda_probe()
    if why_not:
        raise SystemExit(f"flashrt-bench gpu: no usable CUDA device: {why_not}")
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    out = {"device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
           "compute_capability": dev.compute_capability, "cupy": cupy.__version__,
           "points": [point(w) for w in (1024, 16384)]}
    return out
