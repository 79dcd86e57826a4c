"""What a state may hold: the bounds the model implies, checked on every state that comes from outside
(capsule files, persisted log records) before it reaches the runtime. No ROS here.

A checksum says a file was not damaged, not that the state in it could ever have been reached: anyone can
recompute a sha256 or a crc32. These bounds hold for every state the runtime itself produces (each op declares
its buffers' `bound` in model/network.py):

    recurrent_state.L  the GRU hidden state starts at 0 and each step is a convex combination of itself
                       and a tanh output: |h| <= 1.
    mtp_state          the pending action chunks: outputs of the tanh chunk head, or 0: |x| <= 1. The
                       action is their weighted mean, so it is bounded too.
    k/v entries        a linear map of an RMS-normalised vector: xn = x / rms(x) * g with
                       ||x / rms(x)||_2 <= sqrt(d), so per channel j (Cauchy-Schwarz)
                       |k_j| <= sqrt(d) * ||g * W[:, j]||_2 + |b_j|.
    ssm_state.L        a selective scan's state accumulates B * x, which grows with the inputs: only
                       finiteness (as conv_state).
    conv_state.L       the layer's past inputs: the residual stream grows with the observations (any
                       finite float), so only finiteness. A step whose action comes out non-finite is
                       refused anyway (Session.step).
    meta               its invariants (capsule_file.check_meta).

Each limit gets a little slack for rounding (another backend, another summation order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32_MAX = float(np.finfo(np.float32).max)
SLACK_REL, SLACK_ABS = 1e-3, 1e-6  # rounding across backends is far below this; a forged state is far above


def _slack(limit):
    return limit * (1 + SLACK_REL) + SLACK_ABS


def kv_limits(cfg, weights: dict[str, np.ndarray]) -> np.ndarray:
    """[n_layers, 2 (k, v), d_model]: the largest |entry| each KV channel can hold."""
    d = cfg.d_model
    out = np.empty((cfg.n_layers, 2, d), np.float64)
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        g = np.asarray(weights[p + "attn_norm.g"], np.float64)
        w = np.asarray(weights[p + "qkv.w"], np.float64)  # [d, 3d]: q | k | v
        b = np.asarray(weights[p + "qkv.b"], np.float64)
        for kv, cols in enumerate((slice(d, 2 * d), slice(2 * d, 3 * d))):
            out[layer, kv] = np.sqrt(d) * np.linalg.norm(g[:, None] * w[:, cols], axis=0) + np.abs(b[cols])
    return _slack(out).astype(np.float32)


def _first_bad(values: np.ndarray, limit) -> str:
    """Where and what the first value outside [-limit, limit] (or non-finite) is."""
    bad = ~(np.abs(values) <= limit)
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    lim = np.broadcast_to(limit, values.shape)[idx]
    v = values[idx]
    what = "non-finite" if not np.isfinite(v) else f"|{float(v):.4g}| > {float(lim):.4g}"
    return f"{what} at index {idx if len(idx) > 1 else idx[0]}"


@dataclass(frozen=True)
class StateBounds:
    """The bounds of one policy (config + weights). ``check`` raises ValueError naming the buffer."""
    kv: np.ndarray  # [n_layers, 2, d]
    small: dict[str, float]  # small-state buffer name -> max |x| (F32_MAX: finite only)

    @classmethod
    def of_policy(cls, cfg, weights: dict[str, np.ndarray], state_specs) -> StateBounds:
        small = {s.name: F32_MAX if s.bound is None else _slack(s.bound)  # each op declares its state's bound
                 for s in state_specs if np.dtype(s.dtype).kind == "f"}
        return cls(kv_limits(cfg, weights), small)

    def check(self, tensors: dict[str, np.ndarray]) -> None:
        """A materialised state (capsule file): k_cache.L / v_cache.L [kv_window, d] and the small buffers."""
        for name, t in tensors.items():
            if t.dtype.kind != "f":
                continue
            kind, _, layer = name.partition(".")
            if kind in ("k_cache", "v_cache"):
                limit = self.kv[int(layer), 0 if kind == "k_cache" else 1]
            else:
                limit = self.small.get(name, F32_MAX)
            if not (np.abs(t) <= limit).all():
                raise ValueError(f"{name} holds a value no run of this policy can produce "
                                 f"({_first_bad(t, limit)})")

    def check_entries(self, kv: np.ndarray, whole_window: bool) -> None:
        """KV entries as a persisted record holds them: [n, n_layers, 2, d] (a DELTA's), or
        [n_layers, 2, kv_window, d] (a whole window)."""
        limit = self.kv[:, :, None, :] if whole_window else self.kv
        if not (np.abs(kv) <= limit).all():
            raise ValueError(f"KV entries hold a value no run of this policy can produce "
                             f"({_first_bad(kv, np.broadcast_to(limit, kv.shape))})")


class RecordBounds:
    """StateBounds for the small-state rows of persisted records: one vector compare per record."""

    def __init__(self, bounds: StateBounds, arena):
        self.bounds, self.arena = bounds, arena
        n = arena.row_nbytes // 4
        idx, lim = [], []
        for s in arena.state_specs():
            if s.name in bounds.small:
                p = arena.placements[s.name]
                count = s.nbytes // 4
                idx.append(np.arange(p.offset // 4, p.offset // 4 + count))
                lim.append(np.full(count, bounds.small[s.name], np.float32))
        self.index = np.concatenate(idx) if idx else np.zeros(0, np.int64)
        self.limit = np.concatenate(lim) if lim else np.zeros(0, np.float32)
        assert self.index.size == 0 or self.index.max() < n

    def check(self, small: np.ndarray, kv: np.ndarray, whole_window: bool) -> None:
        row = np.asarray(small)[:self.arena.row_nbytes // 4 * 4].view(np.float32)[self.index]
        if not (np.abs(row) <= self.limit).all():
            for s in self.arena.state_specs():  # slow path: name the buffer
                if s.name in self.bounds.small:
                    self.bounds.check({s.name: self.arena.row_view(s.name, small)})
        self.bounds.check_entries(kv, whole_window)


__all__ = ["RecordBounds", "StateBounds", "kv_limits"]
