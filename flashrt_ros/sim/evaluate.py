"""A policy file driving the simulated arm offline: a Session steps it in the world loop, no ROS graph.

Each control period does what the ROS loop does (launch/flashrt_sim.launch.py), minus the transport:
  the world's observation as float32 (the sim publishes Float32MultiArray; observation_type float32_array)
  -> Session.step -> the chunk's first point in the robot's units, as the node's action_trajectory carries it
  (chunk * action_scale + action_offset, in float64) -> the world's joint targets for the next 10 ms.
An episode succeeds as the expert's does (expert.run_episode): the object within the success radius at any step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.model.config import PolicyConfig
from ..runtime.session import Session
from .world import ARM_JOINTS, CONTROL_HZ, OBS_NAMES, PusherWorld

# an offline episode needs no rollback depth and no replan rows: a small budget keeps a Session's setup cheap
EVAL_CAPSULE_BUDGET_MB = 4.0


@dataclass(frozen=True)
class EpisodeResult:
    seed: int
    success: bool
    steps: int  # control steps run: up to the first success, else the whole episode
    final_distance: float  # object to goal (m) when the episode ended


def policy_session(policy_path: str, backend: str = "cpu", max_branches: int = 1,
                   capsule_budget_mb: float = EVAL_CAPSULE_BUDGET_MB) -> Session:
    """A Session on the policy file, checked against the sim's channels (a policy of another robot is refused).
    A planner's Session (sim/mission.py) asks for replan rows and the rollback depth its corrections need."""
    session = Session(PolicyConfig(policy_path=str(policy_path), capsule_budget_mb=capsule_budget_mb,
                                   max_branches=max_branches), backend=backend)
    cfg = session.cfg
    if (cfg.obs_dim, cfg.action_dim) != (len(OBS_NAMES), len(ARM_JOINTS)):
        raise ValueError(f"{policy_path}: obs_dim {cfg.obs_dim} / action_dim {cfg.action_dim}; the arm has "
                         f"{len(OBS_NAMES)} / {len(ARM_JOINTS)}")
    return session


def joint_targets(session: Session, chunk: np.ndarray) -> np.ndarray:
    """The chunk's first point in radians: what the sim takes from the node's action_trajectory (ros/io/outputs.py)."""
    w = session.weights
    return chunk[0].astype(np.float64) * w["action_scale"].astype(np.float64) + w["action_offset"].astype(np.float64)


def run_policy_episode(world: PusherWorld, session: Session, seed: int, seconds: float = 10.0) -> EpisodeResult:
    """One episode from reset(seed), the policy from a fresh state: the same seed gives the same result."""
    obs = world.reset(seed)
    session.reset()
    steps = int(round(seconds * CONTROL_HZ))
    for step in range(1, steps + 1):
        result = session.step(np.asarray(obs, np.float32))
        obs = world.step(joint_targets(session, result.chunk))
        if world.success():
            return EpisodeResult(seed, True, step, world.object_to_goal())
    return EpisodeResult(seed, False, steps, world.object_to_goal())


def evaluate_policy(policy_path: str, seeds, seconds: float = 10.0, backend: str = "cpu") -> list[EpisodeResult]:
    world = PusherWorld()
    session = policy_session(policy_path, backend)
    return [run_policy_episode(world, session, s, seconds) for s in seeds]
