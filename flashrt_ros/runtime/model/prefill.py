"""cold_prefill: the fastest honest recompute of the live state from the observation history.

It walks the network's one description (model/network.py) and runs each op's sequence form over all n steps at
once: GEMMs for every projection, a vectorised causal conv, the GRU's scan (only h @ W_hh is sequential),
windowed causal attention in query chunks (sequence.py holds the tuned forms). The state it writes
matches stepping within float tolerance (GEMM vs GEMV order); meta is exact (kernels.advance_meta).

The last layer computes attention and MLP only for the rows the action head reads: nothing else of that
layer's output reaches the state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .network import walk


@dataclass
class Sequence:
    """What an op's sequence form sees: the weights, the live row, and the KV windows it leaves behind."""
    session: object
    n: int
    windows: list = field(default_factory=list)  # per layer (k, v) as [W, d], slot = position % W

    def __post_init__(self):
        self.cfg, self.backend, self.xp = self.session.cfg, self.session.backend, self.session.backend.xp
        self.head_rows = max(0, self.n - self.cfg.chunk_len)  # the action head reads x at these rows and later
        self._arena = self.session.arena

    def w(self, name: str):
        return self._arena[name]

    def live(self, name: str):
        return self._arena[name][0]

    def first(self, layer: int) -> int:
        """The first row of x a layer's output must keep: after the last layer, only the head's rows."""
        return self.head_rows if layer == self.cfg.n_layers - 1 else 0


def prefill(session, obs: np.ndarray) -> None:
    """Write the state after the observations obs[n, obs_dim] into the live row."""
    with np.errstate(over="ignore"), session.backend.activate():
        _prefill(session, obs)


def _prefill(session, obs: np.ndarray) -> None:
    session.arena.state[0] = 0
    session.kv.clear_row(0)
    n = len(obs)
    if n == 0:
        return
    seq = Sequence(session, n)
    x = obs
    for op, layer in walk(session.cfg):
        x = op.sequence(seq, x, layer)
    pages = session.kv.load(seq.windows, n, min(n, session.cfg.kv_window))  # the row takes over the references
    session.kv.set_row(0, pages)
    session.kv.decref(pages)
