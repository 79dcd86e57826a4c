"""The scripted expert of the Pusher task: observation -> joint targets, with no memory between calls.

Its phase is read off the geometry each step, so it recovers from any state a policy leaves it in:
  - the hand is low but off the pushing line behind the object: lift it straight up (never sweep the object);
  - it is high, or not yet over the pre-push point: go there high, then descend behind the object;
  - it is low on the line behind the object: push, aiming past the object's centre toward the goal.
The hand's pose becomes joint targets through damped least squares on the hand's Jacobian (mj_jac), with the
scoop's opening turned toward the goal and held level.
"""
from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from .world import ARM_JOINTS, HAND_BODY, OBS_NAMES, PusherWorld

_I = {n: i for i, n in enumerate(OBS_NAMES)}
Q = slice(_I[f"{ARM_JOINTS[0]}.position"], _I[f"{ARM_JOINTS[-1]}.position"] + 1)
HAND = slice(_I["hand.x"], _I["hand.z"] + 1)
OBJECT = slice(_I["object.x"], _I["object.y"] + 1)
GOAL = slice(_I["goal.x"], _I["goal.y"] + 1)
UP = np.array([0.0, 0.0, 1.0])
SHOULDER_XY = np.array([0.0, -0.6])  # the pan joint's axis (r_shoulder_pan_link)
# the scoop in the hand's frame (x: opening, y: along the bar): the bar's ends and the prongs' tips
HAND_OUTLINE = ((0.0, -0.1), (0.0, 0.1), (0.1, -0.1), (0.1, 0.1))


@dataclass(frozen=True)
class ExpertGains:
    push_z: float = -0.28  # hand height while pushing: the cylinder spans -0.325 .. -0.225
    travel_z: float = -0.12  # hand height while moving over the object
    behind: float = 0.03  # pre-push point: this far behind the touching position, on the line from the goal
    contact: float = 0.075  # object radius + the scoop's capsule radius, and a little room
    lead: float = 0.15  # how far past contact the push aims (sets the push speed through the PD)
    on_line: float = 0.03  # lateral error (m) below which the hand counts as on the pushing line
    over_point: float = 0.03  # xy error (m) below which the hand may descend
    low: float = -0.2  # a hand below this is low (near the object's height)
    rot_weight: float = 0.3  # orientation error's weight against position's in the least squares
    damping: float = 0.05
    yaw_blend: float = 1.0  # weight of the radial direction in the scoop's yaw
    max_step: float = 0.15  # rad a target may lead its joint by


class PusherExpert:
    """expert(obs) -> joint targets [7]; a scratch copy of the model gives the Jacobian."""

    def __init__(self, world: PusherWorld | None = None, gains: ExpertGains | None = None):
        w = world or PusherWorld()
        self.model, self.data = w.model, mujoco.MjData(w.model)
        self.gains = gains or ExpertGains()
        self.arm_qpos, self.arm_qvel = w.arm_qpos, w.arm_qvel
        self.joint_range = w.joint_range
        self.hand_body = self.model.body(HAND_BODY).id

    def scoop_yaw(self, obs: np.ndarray) -> np.ndarray:
        """Where the scoop opens (unit xy): between the push direction and the arm's own radial direction, so the
        wrist can reach it; the prongs keep the object in the scoop while the push runs at an angle to them."""
        u = _unit(obs[GOAL] - obs[OBJECT])
        radial = _unit(obs[OBJECT] - SHOULDER_XY)
        return _unit(u + self.gains.yaw_blend * radial)

    def hand_goal(self, obs: np.ndarray) -> np.ndarray:
        """The hand position to reach for this observation (the scoop opening toward the goal)."""
        g = self.gains
        hand, obj, goal = obs[HAND], obs[OBJECT], obs[GOAL]
        u = _unit(goal - obj)
        touch = obj - g.contact * self.scoop_yaw(obs)  # the object in the scoop, against its bar
        rel = hand[:2] - touch
        along = float(rel @ u)  # negative: behind the touching position
        lateral = abs(float(rel[0] * u[1] - rel[1] * u[0]))
        low = hand[2] < g.low
        pre = touch - g.behind * u
        if low and lateral < g.on_line and -g.behind - g.on_line < along < g.contact:
            xy, z = touch + g.lead * u, g.push_z
        elif low:
            xy, z = hand[:2], g.travel_z
        elif np.linalg.norm(hand[:2] - pre) < g.over_point:
            xy, z = pre, g.push_z
        else:
            xy, z = pre, g.travel_z
        return np.array([xy[0], xy[1], z])

    def __call__(self, obs) -> np.ndarray:
        obs = np.asarray(obs, np.float64)
        g = self.gains
        q = obs[Q]
        d = self.data
        d.qpos[self.arm_qpos] = q
        mujoco.mj_kinematics(self.model, d)
        mujoco.mj_comPos(self.model, d)
        rot = d.xmat[self.hand_body].reshape(3, 3)
        radial = self.scoop_yaw(obs)
        target = self.hand_goal(obs)
        jp, jr = np.zeros((3, self.model.nv)), np.zeros((3, self.model.nv))
        mujoco.mj_jacBody(self.model, d, jp, jr, self.hand_body)
        x = np.array([radial[0], radial[1], 0.0])
        want = np.column_stack([x, np.cross(UP, x), UP])
        rot_err = 0.5 * sum(np.cross(rot[:, i], want[:, i]) for i in range(3))
        err = np.concatenate([target - d.xpos[self.hand_body], g.rot_weight * rot_err])
        jac = np.vstack([jp[:, self.arm_qvel], g.rot_weight * jr[:, self.arm_qvel]])
        dq = jac.T @ np.linalg.solve(jac @ jac.T + g.damping ** 2 * np.eye(6), err)
        dq = np.clip(dq, -g.max_step, g.max_step)
        return np.clip(q + dq, self.joint_range[:, 0], self.joint_range[:, 1])


def _unit(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-9)


def run_episode(world: PusherWorld, expert, seed: int, seconds: float = 8.0) -> bool:
    """One episode of the expert from reset(seed); True when the object ends within the success radius."""
    obs = world.reset(seed)
    for _ in range(int(seconds * 100)):
        obs = world.step(expert(obs))
        if world.success():
            return True
    return False


def success_rate(seeds, seconds: float = 8.0, gains: ExpertGains | None = None) -> float:
    world = PusherWorld()
    expert = PusherExpert(world, gains)
    seeds = list(seeds)
    return sum(run_episode(world, expert, s, seconds) for s in seeds) / len(seeds)
