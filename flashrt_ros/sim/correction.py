"""Rollback that fixes a bad sensor, offline: a Session steps what a faulty sensor reports, and when a fault's
corrected measurement arrives the policy is rolled back to the capsule before the fault and re-steps the
corrected observations as ONE committed replan (Session.replan from that capsule, commit_branch=0), so the
recurrent state and the KV window no longer hold the bad readings.

The world loop is evaluate.run_policy_episode's, plus the sensor in between; an episode runs its whole length
(no stop at success) so its arm and hand trace line up step for step with the no-fault run of its seed. The
correction is applied at the start of the period it arrives in, before that period's live step: the replan's
last step is the reading just before. A `reference` Session stepping the true observations alongside makes each
commit a byte-exact check: the committed state must equal it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..runtime.session import Session
from .evaluate import joint_targets
from .faults import HAND, POSITIONS, FaultySensor, SensorFault
from .world import CONTROL_HZ, PusherWorld

REPLAN_BUDGET_MS = 50.0


@dataclass
class FaultEpisode:
    seed: int
    success: bool
    success_step: int  # first step with the object in the goal; 0: never
    final_distance: float  # object to goal (m) at the episode's end
    joints: np.ndarray  # [steps, 7] the arm's joint positions after each step (the world's, not the sensor's)
    hand: np.ndarray  # [steps, 3] the hand's position after each step
    true_obs: np.ndarray  # [steps, obs_dim] float32: what a healthy sensor would have read at each step
    faults: list[SensorFault] = field(default_factory=list)
    replan_ms: list[float] = field(default_factory=list)  # each correction's replan, fork to commit
    byte_exact: list[bool] = field(default_factory=list)  # each commit against the reference Session


def run_fault_episode(world: PusherWorld, session: Session, seed: int, faults: list[SensorFault],
                      correct: bool, seconds: float = 10.0, reference: Session | None = None,
                      on_step=None) -> FaultEpisode:
    """One episode of the seed with these faults; `correct` applies each fault's rollback correction.
    `on_step(step, session, world)` runs after each live step (tests look at the state there)."""
    steps = int(round(seconds * CONTROL_HZ))
    sensor = FaultySensor(faults)
    arrivals = {f.arrival: f for f in faults} if correct else {}
    obs = world.reset(seed)
    session.reset()
    if reference is not None:
        reference.reset()
    capsule_of = {}  # step -> the live capsule taken after it
    true_obs = np.empty((steps, len(obs)), np.float32)
    joints, hand = np.empty((steps, 7)), np.empty((steps, 3))
    replan_ms, exact, success_step = [], [], 0
    for n in range(1, steps + 1):
        fault = arrivals.get(n)
        if fault is not None:
            ms, live_id = correct_fault(session, fault, capsule_of[fault.start - 1], true_obs)
            replan_ms.append(ms)
            capsule_of[n - 1] = live_id
            if reference is not None:
                exact.append(session.state_host(0).tobytes() == reference.state_host(0).tobytes())
        true_obs[n - 1] = obs
        result = session.step(sensor.read(n, obs))
        capsule_of[n] = result.capsule_id
        if reference is not None:
            reference.step(true_obs[n - 1])
        obs = world.step(joint_targets(session, result.chunk))
        joints[n - 1], hand[n - 1] = obs[POSITIONS], obs[HAND]
        if not success_step and world.success():
            success_step = n
        if on_step is not None:
            on_step(n, session, world)
    return FaultEpisode(seed, success_step > 0, success_step, world.object_to_goal(), joints, hand, true_obs,
                        list(faults), replan_ms, exact)


def correct_fault(session: Session, fault: SensorFault, before_fault: int, true_obs: np.ndarray) -> tuple[float, int]:
    """Roll back to `before_fault` (the capsule after step fault.start - 1) and re-step the corrected readings
    fault.start .. fault.arrival - 1 as one committed replan. Returns (its milliseconds, the new live capsule)."""
    block = true_obs[fault.start - 1:fault.arrival - 1][None]
    t0 = time.perf_counter()
    result = session.replan(before_fault, block, commit_branch=0)
    ms = (time.perf_counter() - t0) * 1e3
    if result.steps_done != block.shape[1]:
        raise RuntimeError(f"correction replan stopped after {result.steps_done}/{block.shape[1]} steps: "
                           f"{result.message}")
    return ms, result.live_capsule_id


def tracking_error(run: FaultEpisode, clean: FaultEpisode) -> tuple[float, float]:
    """(mean joint distance in rad, mean hand distance in m) from the no-fault run of the same seed, step by step
    over the whole episode: how far the faults pushed the arm off the path it takes with a healthy sensor."""
    joint = float(np.linalg.norm(run.joints - clean.joints, axis=1).mean())
    hand = float(np.linalg.norm(run.hand - clean.hand, axis=1).mean())
    return joint, hand
