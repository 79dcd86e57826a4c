"""Observation history as a lineage tree, so the cold baselines recompute the *live* branch.

Every step adds a node (its observation, its parent). Rollback moves the head to the node a capsule
was taken at; a committed replan grows a new branch from there. Unreachable branches are freed by
the garbage collector once no capsule refers to them.
"""
from __future__ import annotations

import numpy as np


class _Node:
    __slots__ = ("obs", "parent", "step")

    def __init__(self, obs: np.ndarray, parent: _Node | None):
        self.obs = obs
        self.parent = parent
        self.step = 1 if parent is None else parent.step + 1


class ObsHistory:
    def __init__(self):
        self.head: _Node | None = None
        self._at_capsule: dict[int, _Node | None] = {}

    @property
    def steps(self) -> int:
        return 0 if self.head is None else self.head.step

    def push(self, obs: np.ndarray) -> None:
        self.head = _Node(obs, self.head)

    def mark(self, capsule_id: int, head: _Node | None | bool = False) -> None:
        """Remember the history node that capsule ``capsule_id`` was taken at (default: the head)."""
        self._at_capsule[capsule_id] = self.head if head is False else head

    def node_of(self, capsule_id: int):
        return self._at_capsule[capsule_id]

    def prune(self, live_ids) -> None:
        for cid in [c for c in self._at_capsule if c not in live_ids]:
            del self._at_capsule[cid]

    def truncate(self, n: int) -> None:
        """Move the head back to step n of the live branch."""
        while self.head is not None and self.head.step > n:
            self.head = self.head.parent

    def reset(self) -> None:
        self.head = None
        self._at_capsule.clear()

    def observations(self, n: int | None = None) -> np.ndarray:
        """The first ``n`` observations of the live branch (all when None), oldest first: [n, obs_dim]."""
        out, node = [], self.head
        while node is not None:
            out.append(node.obs)
            node = node.parent
        out.reverse()
        if n is not None:
            if n > len(out):
                raise ValueError(f"history holds {len(out)} steps, asked for {n}")
            out = out[:n]
        return np.stack(out) if out else np.zeros((0, 0), np.float32)
