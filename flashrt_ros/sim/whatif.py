"""What-ifs judged by the world, offline: under a biased object estimate, the planner tries K hypotheses of where
the object is and commits the one whose actions do best in a forked copy of the physics.

The estimate: the sensor's object x, y carry a constant error per episode (a miscalibrated camera, 3-6 cm in a
seeded direction); the planner keeps an offset it adds to every reading, 0 at first. At each what-if (every
`every` steps) it takes K hypotheses (the estimate itself, branch 0, and a ring around it) and runs ONE batched
replan from the live capsule: branch k steps `horizon` copies of this period's reading with the object at
hypothesis k (one policy step per period, so branch 0's first action is the one the live step would take; the
readings are held, so a branch, and the live arm once it is committed, runs open loop for those steps).
Each branch's actions are rolled through a fork of the live physics (PusherWorld.set_state of its state) and
scored by the task's outcome, the object-to-goal distance at the end of the rollout (lower is better). The best
branch is committed (a rollback to its end capsule), the live world executes its actions, which must leave it
byte-identical to that branch's fork, and its hypothesis becomes the estimate from then on (the offset moves by
its displacement): a constant error found once stays found. The ring's radius halves at each commit, coarse to
fine. While the hand is away from the object every fork ends with the object where it was: when the scores span
less than `decisive_m`, nothing is committed and the live step goes on as if no what-if had run.

The fork is the simulator's true state, object included: the judge knows where the object is, the policy does
not. That is the privilege of a simulated world; on a robot the fork would be a model with its own errors.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..runtime.session import Session
from .evaluate import joint_targets
from .faults import OBJECT
from .world import CONTROL_HZ, PusherWorld


@dataclass(frozen=True)
class WhatIfConfig:
    bias_m: tuple[float, float] = (0.03, 0.06)  # the estimate's constant error, magnitude
    hypotheses: int = 9  # K: the estimate and a ring of K - 1 around it
    radius_m: float = 0.04  # the ring at the first what-if; halves at each next one
    min_radius_m: float = 0.005
    horizon: int = 20  # steps a branch is rolled out and, once committed, executed (200 ms)
    every: int = 50  # steps between what-ifs
    adopt: bool = True  # a committed hypothesis becomes the estimate (False: the ablation, the estimate kept)
    decisive_m: float = 0.001  # forks closer than this in score tell nothing apart: nothing is committed
    first_step: int = 20


@dataclass
class WhatIf:
    step: int  # the period whose reading the branches start from
    hypotheses: np.ndarray  # [K, 2] object x, y
    actions: np.ndarray  # [K, horizon, 7] each branch's actions (the node's `action`)
    scores: list[float]  # each branch's outcome in its fork, lower is better
    branch_capsules: list[int]
    committed: int  # the branch made live; -1: none (the forks' scores too close to tell)
    world_state: bytes  # the live world the forks started from
    fork_states: list[bytes]  # each fork's world state at the end of its rollout
    replan_ms: float


@dataclass
class BiasedEpisode:
    seed: int
    success: bool
    success_step: int
    final_distance: float
    bias: np.ndarray  # the sensor's object error (m)
    final_offset: np.ndarray  # the planner's estimate correction at the end (ideally -bias)
    what_ifs: list[WhatIf] = field(default_factory=list)
    byte_exact: list[bool] = field(default_factory=list)  # live world after a commit == that branch's fork


def draw_bias(seed: int, config: WhatIfConfig | None = None) -> np.ndarray:
    c = config or WhatIfConfig()
    rng = np.random.default_rng([seed, 0xB1A5])
    angle = rng.uniform(0.0, 2 * np.pi)
    return rng.uniform(*c.bias_m) * np.array([np.cos(angle), np.sin(angle)])


def hypotheses(estimate: np.ndarray, radius: float, count: int) -> np.ndarray:
    """[count, 2]: the estimate first, then count - 1 points on a circle of `radius` around it."""
    angles = 2 * np.pi * np.arange(count - 1) / max(count - 1, 1)
    ring = estimate + radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    return np.vstack([estimate[None], ring])


def world_score(world: PusherWorld) -> float:
    """The task's outcome: the object's distance to the goal (m), lower is better."""
    return world.object_to_goal()


def action_targets(action: np.ndarray) -> np.ndarray:
    """A replan branch's action as joint targets: the node's `action` (blend * scale + offset, float32)."""
    return np.asarray(action, np.float64)


def what_if(session: Session, world: PusherWorld, twin: PusherWorld, reading: np.ndarray, hyps: np.ndarray,
            horizon: int, step: int, decisive_m: float = 0.0) -> WhatIf:
    """One batched replan of len(hyps) branches from the live capsule, each branch scored in a fork of the live
    world, the best committed unless the scores span less than decisive_m (then `committed` is -1 and the live
state is as before). The live world is untouched: the caller executes the committed actions."""
    block = np.repeat(np.asarray(reading, np.float32)[None, None], len(hyps), axis=0).repeat(horizon, axis=1)
    block[:, :, OBJECT] = hyps[:, None, :].astype(np.float32)
    t0 = time.perf_counter()
    result = session.replan(None, block)
    replan_ms = (time.perf_counter() - t0) * 1e3
    live_state = world.state()
    scores, fork_states = [], []
    for k in range(len(hyps)):
        twin.set_state(live_state)
        for action in result.actions[k]:
            twin.step(action_targets(action))
        scores.append(world_score(twin))
        fork_states.append(twin.state())
    best = int(np.argmin(scores))  # ties go to the lowest branch: the estimate as it stands
    if max(scores) - min(scores) < decisive_m:
        best = -1  # the world cannot tell the hypotheses apart (the hand is not at the object): the live step goes on
    else:
        session.rollback(result.branch_capsule_ids[best])
    return WhatIf(step, hyps, result.actions, scores, list(result.branch_capsule_ids), best, live_state,
                  fork_states, replan_ms)


def run_biased_episode(world: PusherWorld, twin: PusherWorld, session: Session, seed: int, select: bool,
                       seconds: float = 10.0, config: WhatIfConfig | None = None) -> BiasedEpisode:
    """One episode of the seed with the object estimate biased; `select` runs the what-ifs."""
    c = config or WhatIfConfig()
    steps = int(round(seconds * CONTROL_HZ))
    bias = draw_bias(seed, c)
    offset, radius = np.zeros(2), c.radius_m
    obs = world.reset(seed)
    session.reset()
    what_ifs, exact, success_step, n = [], [], 0, 1
    while n <= steps:
        reading = np.array(obs, np.float32)
        reading[OBJECT] = obs[OBJECT] + bias + offset
        if select and n >= c.first_step and (n - c.first_step) % c.every == 0 and n + c.horizon - 1 <= steps:
            estimate = reading[OBJECT].astype(np.float64)
            hyps = hypotheses(estimate, radius, c.hypotheses)
            chosen = what_if(session, world, twin, reading, hyps, c.horizon, n, c.decisive_m)
            what_ifs.append(chosen)
            if chosen.committed >= 0:  # the live world executes the committed branch's actions
                for action in chosen.actions[chosen.committed]:
                    obs = world.step(action_targets(action))
                    if not success_step and world.success():
                        success_step = n
                    n += 1
                exact.append(world.state() == chosen.fork_states[chosen.committed])
                if c.adopt:
                    offset = offset + chosen.hypotheses[chosen.committed] - estimate
                    radius = max(radius / 2, c.min_radius_m)
                continue
        result = session.step(reading)
        obs = world.step(joint_targets(session, result.chunk))
        if not success_step and world.success():
            success_step = n
        n += 1
    return BiasedEpisode(seed, success_step > 0, success_step, world.object_to_goal(), bias, offset, what_ifs, exact)
