"""The golden run: a fixed seeded run whose every output byte is hashed (test/test_golden.py).

First computed on c220c38 (before the one-model redesign, issue 16); recomputed once since, for an intended
change (2026-12-05: the seeded weights became bf16 values), under every build and kernel family listed, and checked
in as default_config.json; any change to an action, a capsule, an exported file or a prefill shows up as a changed
hash.
Regenerate only for an intended change of behaviour:  .venv/bin/python test/golden_run.py --write
--write fills the entry of this machine's OpenBLAS kernel family: runs_by_blas_core's where that family is
listed there (the AVX-512 ones), else the plain entries (AVX2); after an intended change, run it under both
(OPENBLAS_CORETYPE=Haswell and =SkylakeX on an AVX-512 CPU). Another numpy build or kernel family while the
behaviour stands (test_golden.py names it when it fails): run this file in a worktree of c220c38 with that venv
and add what it prints under prefill_state_by_numpy or runs_by_blas_core.
"""
from __future__ import annotations

import hashlib
import json
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from flashrt_ros.runtime import PolicyConfig, Session  # noqa: E402

GOLDEN = HERE / "golden" / "default_config.json"

# name -> (config changes from PolicyConfig(), steps). The default config crosses two KV pages; the small
# one wraps its window several times; the noisy one runs the counter-based RNG.
RUNS = {
    "default": (dict(), 300),
    "small_wrapping": (dict(d_model=32, n_layers=2, n_heads=2, kv_window=48, chunk_len=4, capsule_capacity=96,
                            capsule_budget_mb=64.0), 200),
    "noisy": (dict(d_model=32, n_layers=2, n_heads=2, kv_window=48, chunk_len=4, capsule_budget_mb=64.0,
                   action_noise_std=0.3, seed=7), 120),
}


def trace(n: int, obs_dim: int, seed: int = 0) -> np.ndarray:
    """A smooth joint trace plus noise, float32 (the same recipe as conftest.observation_trace)."""
    t = np.arange(n)[:, None] * 0.01
    j = np.arange(obs_dim // 2)[None, :]
    rng = np.random.default_rng(seed)
    pos = np.sin(2 * np.pi * (0.3 + 0.1 * j) * t + j) + 0.05 * rng.standard_normal((n, obs_dim // 2))
    vel = np.diff(pos, axis=0, prepend=pos[:1]) * 100.0
    return np.concatenate([pos, vel], axis=1).astype(np.float32)


def sha(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else np.ascontiguousarray(p).tobytes())
    return h.hexdigest()


def tensors_sha(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name, t in tensors.items():  # table order: a reordered table is a change too
        h.update(f"{name}:{t.dtype}:{t.shape};".encode())
        h.update(np.ascontiguousarray(t).tobytes())
    return h.hexdigest()


def file_sha(blob: bytes) -> str:
    """A safetensors file's header (canonical JSON: safetensors writes its metadata map in a random key
    order, so the raw bytes differ run to run) and every data byte after it."""
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return sha(json.dumps(header, sort_keys=True).encode(), blob[8 + n:])


def golden_run(changes: dict, steps: int) -> dict[str, str]:
    cfg = PolicyConfig(**changes)
    s = Session(cfg, backend="numpy")
    obs = trace(steps + 16, cfg.obs_dim)
    results = [s.step(o) for o in obs[:steps]]
    out = {"fingerprint": s.fingerprint,
           "actions": sha(*(r.action for r in results)),
           "chunks": sha(*(r.chunk for r in results))}
    # a few capsules materialised as full state rows (all still held by the smallest store)
    for i in (steps - 80, steps - 37, steps - 1):
        out[f"capsule_step_{i + 1}"] = tensors_sha(s.materialize(results[i].capsule_id))
    out["live_state"] = tensors_sha(s.state_tensors())
    # the exported file (stamps are 0 here and it holds no clock)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "capsule.safetensors"
        s.export_capsule(results[steps - 37].capsule_id, path)
        out["exported_file"] = file_sha(path.read_bytes())
    # a replan from a mid-run capsule: 4 branches of 8 steps, no commit, then one with commit
    rng = np.random.default_rng(1)
    what_if = (obs[steps - 8:steps][None] + 0.1 * rng.standard_normal((4, 8, cfg.obs_dim))).astype(np.float32)
    r = s.replan(results[steps - 9].capsule_id, what_if)
    out["replan_actions"] = sha(r.actions)
    r = s.replan(0, what_if[:2], commit_branch=1)
    out["replan_commit_actions"] = sha(r.actions)
    out["after_commit_state"] = tensors_sha(s.state_tensors())
    out["after_commit_step_actions"] = sha(*(s.step(o).action for o in obs[steps:steps + 8]))
    # cold prefill of the live history (float tolerance vs stepping, but bytes fixed per backend)
    s.cold_prefill()
    out["prefill_state"] = tensors_sha(s.state_tensors())
    return out


def blas_core() -> str:
    """The kernel family numpy's OpenBLAS picked for this CPU ('Haswell', 'Zen', 'SkylakeX'; '' if unknown): its
    small GEMMs block, so round, per family, and cold prefill's bytes with them."""
    import ctypes
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_corename64_", "openblas_get_corename64_", "openblas_get_corename"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return ""


def compute() -> dict[str, dict[str, str]]:
    return {name: golden_run(changes, steps) for name, (changes, steps) in RUNS.items()}


if __name__ == "__main__":
    got = compute()
    if "--write" in sys.argv:  # other builds' hashes (test_golden.py) are kept as they were
        kept, core = json.loads(GOLDEN.read_text()), blas_core()
        if core in kept.get("runs_by_blas_core", {}):
            kept["runs_by_blas_core"][core] = got
        else:
            kept.update(got)
        GOLDEN.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN} ({core or 'unknown'} kernels)")
    else:
        print(json.dumps(got, indent=1, sort_keys=True))
