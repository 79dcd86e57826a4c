"""Observation history as a lineage tree, so the cold baselines recompute the *live* branch.

Every step adds a node (its observation, its parent). Rollback moves the head to the node a capsule
was taken at; a committed replan grows a new branch from there. Unreachable branches are freed by
the garbage collector once no capsule refers to them, and the live branch keeps at most about
``limit`` (up to 2 x limit) observations, so a robot running for hours does not grow without bound.
"""
from __future__ import annotations

import numpy as np


class _Node:
    __slots__ = ("obs", "parent", "step")

    def __init__(self, obs: np.ndarray, parent: _Node | None, step: int):
        self.obs = obs
        self.parent = parent
        self.step = step  # steps taken once this observation was stepped


class HistoryIncomplete(ValueError):
    pass


class ObsHistory:
    def __init__(self, limit: int):
        self.limit = limit
        self.head: _Node | None = None
        self._at_capsule: dict[int, _Node | None] = {}

    def push(self, obs: np.ndarray, step: int) -> None:
        self.head = _Node(obs, self.head, step)
        if step % self.limit == 0:  # amortised O(1): cut the chain one limit below the head
            node = self.head
            for _ in range(self.limit - 1):
                if node.parent is None:
                    return
                node = node.parent
            node.parent = None

    def branch(self, base: _Node | None, base_step: int, obs: np.ndarray) -> _Node | None:
        """The node reached by stepping obs[k, obs_dim] from ``base``, leaving the head alone."""
        node = base
        for i, o in enumerate(obs):
            node = _Node(o, node, base_step + i + 1)
        return node

    def mark(self, capsule_id: int, node: _Node | None) -> None:
        """Remember where capsule ``capsule_id`` sits in the history (None: unknown, e.g. imported)."""
        self._at_capsule[capsule_id] = node

    def node_of(self, capsule_id: int) -> _Node | None:
        return self._at_capsule.get(capsule_id)

    def forget(self, capsule_id: int) -> None:
        """The capsule is gone: its place (and the branch of observations only it kept) is freed."""
        self._at_capsule.pop(capsule_id, None)

    def __len__(self) -> int:
        return len(self._at_capsule)

    def truncate(self, n: int) -> None:
        """Move the head back to step n of the live branch."""
        while self.head is not None and self.head.step > n:
            self.head = self.head.parent

    def reset(self) -> None:
        self.head = None
        self._at_capsule.clear()

    def observations(self, live_step: int, n: int | None = None) -> np.ndarray:
        """The first ``n`` observations of the live branch (all when None), oldest first: [n, obs_dim].
        Raises HistoryIncomplete when they are not all kept (history_limit, imported capsule)."""
        out, node = [], self.head
        while node is not None:
            out.append(node.obs)
            node = node.parent
        out.reverse()
        if len(out) != live_step:
            raise HistoryIncomplete(f"only the last {len(out)} of {live_step} observations of the live state are "
                                    "known (history_limit, or an imported capsule): no cold recompute")
        if n is not None:
            if not 0 <= n <= len(out):
                raise ValueError(f"history holds {len(out)} steps, asked for {n}")
            out = out[:n]
        return np.stack(out) if out else np.zeros((0, 0), np.float32)
