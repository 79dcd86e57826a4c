"""The scripted expert of the Pusher task: observation -> joint targets, with no memory between calls.

The hand's colliding part is a U of three capsules that the arm cannot hold level, nor turn at will, near the
table, so the expert pushes with whichever capsule the line from the object to the goal meets (the pusher point)
rather than with a fixed face. Its phase is read off the geometry each step, so it recovers from any state a
policy leaves it in:
  - the hand is low and its pusher point is on the line behind the object: push, aiming past the object;
  - the hand is low anywhere else: lift it straight up (never sweep across the object);
  - it is high over the pre-push point behind the object: descend; high elsewhere: travel there.
The pusher point's goal becomes joint targets through damped least squares on the hand's Jacobian (mj_jac).
"""
from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from .world import ARM_JOINTS, OBS_NAMES, PusherWorld

_I = {n: i for i, n in enumerate(OBS_NAMES)}
Q = slice(_I[f"{ARM_JOINTS[0]}.position"], _I[f"{ARM_JOINTS[-1]}.position"] + 1)
HAND = slice(_I["hand.x"], _I["hand.z"] + 1)
OBJECT = slice(_I["object.x"], _I["object.y"] + 1)
GOAL = slice(_I["goal.x"], _I["goal.y"] + 1)
PUSHER_BODY = "r_wrist_roll_link"  # holds the hand's three colliding capsules
UP = np.array([0.0, 0.0, 1.0])
# the null space pulls the three roll joints home, so the arm does not wander into twisted postures the task
# cannot leave (the rest is free: the task sets it)
REST_POSTURE = np.zeros(len(ARM_JOINTS))
REST_WEIGHT = np.array([0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])


@dataclass(frozen=True)
class ExpertGains:
    push_z: float = -0.28  # hand height while pushing: the cylinder spans -0.325 .. -0.225
    travel_z: float = -0.05  # hand height while moving over the object
    contact: float = 0.075  # object radius + capsule radius + a little room: pusher point to object centre
    behind: float = 0.05  # pre-push point: this far further back than contact
    lead: float = 0.03  # how far past contact the push aims (sets the push speed through the PD)
    on_line: float = 0.03  # lateral error (m) below which the pusher point counts as on the pushing line
    over_point: float = 0.03  # xy error (m) below which the hand may descend
    low: float = -0.22  # a hand below this is low (near the object's height)
    level_weight: float = 0.05  # weight of keeping the hand level, against position's 1
    damping: float = 0.05
    posture_gain: float = 0.6  # how hard the null space pulls the rolls home
    max_move: float = 0.1  # m the hand is aimed ahead per step: far targets are approached in a straight line
    max_step: float = 0.15  # rad a target may lead its joint by


def _unit(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-9)


class PusherExpert:
    """expert(obs) -> joint targets [7]; a scratch copy of the model gives the hand's pose and Jacobian."""

    def __init__(self, world: PusherWorld | None = None, gains: ExpertGains | None = None):
        w = world or PusherWorld()
        self.model, self.data = w.model, mujoco.MjData(w.model)
        self.gains = gains or ExpertGains()
        self.arm_qpos, self.arm_qvel = w.arm_qpos, w.arm_qvel
        self.joint_range = w.joint_range
        self.hand_body = self.model.body(PUSHER_BODY).id
        m = self.model
        self.capsules = [g for g in range(m.ngeom) if m.geom_bodyid[g] == self.hand_body and m.geom_contype[g]]

    def _segments(self) -> np.ndarray:
        """The hand's capsules seen from above, as segments [3, 2 ends, xy]: the bar and the two prongs."""
        d, m = self.data, self.model
        segs = []
        for g in self.capsules:
            axis = d.geom_xmat[g].reshape(3, 3)[:2, 2] * m.geom_size[g][1]
            segs.append([d.geom_xpos[g][:2] - axis, d.geom_xpos[g][:2] + axis])
        return np.array(segs)

    @staticmethod
    def pusher_point(segments: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Where an object ahead along u, on the line through the hand's centre, meets the hand: the farthest
        crossing of that line with a capsule (through the U's opening that is the bar, behind the centre)."""
        centre = segments.reshape(-1, 2).mean(0)
        best = None
        for p, q in segments:
            edge = q - p
            det = edge[0] * u[1] - edge[1] * u[0]
            if abs(det) < 1e-12:
                continue
            rel = p - centre
            t = (edge[0] * rel[1] - edge[1] * rel[0]) / det
            s = (u[0] * rel[1] - u[1] * rel[0]) / det
            if -1e-9 <= s <= 1 + 1e-9 and (best is None or t > best):
                best = t
        return centre + (0.0 if best is None else best) * u

    def pusher_goal(self, obs: np.ndarray, hand: np.ndarray, pusher: np.ndarray) -> np.ndarray:
        """Where the hand's origin should go (xyz), given where the pusher point is now."""
        g = self.gains
        obj, goal = obs[OBJECT], obs[GOAL]
        u = _unit(goal - obj)
        touch = obj - g.contact * u
        rel = pusher[:2] - touch
        along = float(rel @ u)  # negative: behind the touching position
        lateral = abs(float(rel[0] * u[1] - rel[1] * u[0]))
        low = hand[2] < g.low
        pre = touch - g.behind * u
        if low and lateral < g.on_line and -g.behind - g.on_line < along < g.contact:
            xy, z = touch + (max(along, 0.0) + g.lead) * u, g.push_z  # on the line, lead ahead of the pusher
        elif low:
            xy, z = pusher[:2], g.travel_z
        elif np.linalg.norm(pusher[:2] - pre) < g.over_point:
            xy, z = pre, g.push_z
        else:
            xy, z = pre, g.travel_z
        shift = xy - pusher[:2]  # move the hand so its pusher point lands on xy
        return np.array([hand[0] + shift[0], hand[1] + shift[1], z])

    def __call__(self, obs) -> np.ndarray:
        obs = np.asarray(obs, np.float64)
        g, d, m = self.gains, self.data, self.model
        q = obs[Q]
        d.qpos[self.arm_qpos] = q
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        u = _unit(obs[GOAL] - obs[OBJECT])
        pusher = self.pusher_point(self._segments(), u)
        hand = d.xpos[self.hand_body]
        target = self.pusher_goal(obs, hand, pusher)
        jp, jr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
        mujoco.mj_jacBody(m, d, jp, jr, self.hand_body)
        up_err = np.cross(d.xmat[self.hand_body].reshape(3, 3)[:, 2], UP)
        to_target = target - hand
        to_target *= min(1.0, g.max_move / max(float(np.linalg.norm(to_target)), 1e-9))  # straight, not swinging
        err = np.concatenate([to_target, g.level_weight * up_err])
        jac = np.vstack([jp[:, self.arm_qvel], g.level_weight * jr[:, self.arm_qvel]])
        pinv = jac.T @ np.linalg.inv(jac @ jac.T + g.damping ** 2 * np.eye(6))
        posture = g.posture_gain * REST_WEIGHT * (REST_POSTURE - q)  # the rolls back to 0 where the task leaves room
        dq = pinv @ err + (np.eye(len(q)) - pinv @ jac) @ posture
        dq = np.clip(dq, -g.max_step, g.max_step)
        return np.clip(q + dq, self.joint_range[:, 0], self.joint_range[:, 1])


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
