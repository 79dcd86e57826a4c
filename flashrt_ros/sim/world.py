"""The simulated robot: Gymnasium's MuJoCo Pusher (a 7-joint arm, a cylinder to push, a goal disc on a table).

The model is loaded from the installed gymnasium package (its assets, MIT licensed), so the repository vendors no
asset and imports none of gymnasium's code. The arm is position-controlled: each control step holds a joint
target, and a PD law turns it into the model's motor torques at every physics substep. No rclpy here: the world
is testable alone, and its state is a byte string (mj_getState), so a capsule of the world can sit beside the
policy's.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

ARM_JOINTS = ("r_shoulder_pan_joint", "r_shoulder_lift_joint", "r_upper_arm_roll_joint", "r_elbow_flex_joint",
              "r_forearm_roll_joint", "r_wrist_flex_joint", "r_wrist_roll_joint")
HAND_BODY = "tips_arm"  # the wrist's U-shaped scoop: its origin is the middle of the pushing bar
OBJECT_JOINTS = ("obj_slidex", "obj_slidey")
GOAL_JOINTS = ("goal_slidex", "goal_slidey")
OBS_NAMES = ([f"{j}.position" for j in ARM_JOINTS] + [f"{j}.velocity" for j in ARM_JOINTS]
             + ["hand.x", "hand.y", "hand.z", "object.x", "object.y", "goal.x", "goal.y"])
OBS_DIM = len(OBS_NAMES)
CONTROL_HZ = 100
# mjSTATE_INTEGRATION: everything mj_step reads (time, qpos, qvel, act, warm start, ctrl, ...), so restoring it
# makes the next step byte-identical
STATE_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION


def pusher_xml() -> Path:
    """Gymnasium's pusher_v5.xml, found without importing gymnasium (its package init pulls in much more)."""
    spec = importlib.util.find_spec("gymnasium")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("flashrt-sim needs the gymnasium package for its Pusher model "
                                  "(pip install gymnasium; requirements-ros.txt)")
    path = Path(next(iter(spec.submodule_search_locations))) / "envs" / "mujoco" / "assets" / "pusher_v5.xml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: this gymnasium has no Pusher v5 model")
    return path


@dataclass(frozen=True)
class WorldConfig:
    substeps: int = 5  # physics steps per 10 ms control step (timestep 2 ms: Euler stays stable under the PD)
    kp: float = 40.0  # joint PD gains, torque per rad and per rad/s; the model clips torque to +-2
    kd: float = 8.0
    object_x: tuple[float, float] = (-0.3, 0.0)  # object offset from the table's reference point (Gymnasium's)
    object_y: tuple[float, float] = (-0.2, 0.2)
    goal_xy: float = 0.05  # the goal moves within +-goal_xy of Gymnasium's fixed goal, so it is an observation
    min_distance: float = 0.17  # the object starts at least this far from the goal
    # Gymnasium's box, less what the hand cannot get behind at table height: the point `approach` behind the
    # object (away from the goal) must lie between min_reach (the folded arm) and max_reach (the stretched arm
    # low over the table) from the shoulder's axis
    approach: float = 0.2
    min_reach: float = 0.5
    max_reach: float = 0.8
    # contact stiffness (MuJoCo solref time constant, s): at the default 0.02 the hand sinks 5 cm into the light,
    # damped cylinder and pushes it at 3 cm/s; at 0.01 the cylinder stays ahead of the hand
    contact_timeconst: float = 0.01
    arm_noise: float = 0.005  # rad, uniform, on the arm's initial joints
    success_radius: float = 0.05  # m between object and goal centres

    @property
    def timestep(self) -> float:
        return 1.0 / CONTROL_HZ / self.substeps


class PusherWorld:
    """reset(seed) -> obs; step(joint_targets) -> obs, 10 ms of sim time; state() / set_state(bytes)."""

    def __init__(self, config: WorldConfig | None = None):
        self.config = config or WorldConfig()
        self.model = mujoco.MjModel.from_xml_path(str(pusher_xml()))
        self.model.opt.timestep = self.config.timestep
        self.model.geom_solref[:] = (self.config.contact_timeconst, 1.0)
        self.data = mujoco.MjData(self.model)
        jnt = lambda n: self.model.joint(n)  # noqa: E731
        self.arm_qpos = np.array([jnt(n).qposadr[0] for n in ARM_JOINTS])
        self.arm_qvel = np.array([jnt(n).dofadr[0] for n in ARM_JOINTS])
        self.object_qpos = np.array([jnt(n).qposadr[0] for n in OBJECT_JOINTS])
        self.goal_qpos = np.array([jnt(n).qposadr[0] for n in GOAL_JOINTS])
        self.joint_range = np.array([jnt(n).range for n in ARM_JOINTS])
        act_joint = self.model.actuator_trnid[:, 0]
        self.actuator_of_joint = np.array([list(act_joint).index(jnt(n).id) for n in ARM_JOINTS])
        self.hand_body = self.model.body(HAND_BODY).id
        self.object_body = self.model.body("object").id
        self.goal_body = self.model.body("goal").id
        self.targets = np.zeros(len(ARM_JOINTS))
        self.shoulder_xy = self.model.body("r_shoulder_pan_link").pos[:2].copy()
        self.table_origin = self.model.body("object").pos[:2].copy()  # where the object's slide joints read 0
        self._state_size = mujoco.mj_stateSize(self.model, STATE_SPEC)

    # ---- episodes -------------------------------------------------------------------------------------------
    def reset(self, seed: int) -> np.ndarray:
        """The episode of this seed: the same seed gives the same state, byte for byte."""
        c, rng = self.config, np.random.default_rng(seed)
        mujoco.mj_resetData(self.model, self.data)
        while True:
            obj = np.array([rng.uniform(*c.object_x), rng.uniform(*c.object_y)])
            goal = rng.uniform(-c.goal_xy, c.goal_xy, 2)
            if self._placeable(obj, goal):
                break
        self.data.qpos[self.arm_qpos] = rng.uniform(-c.arm_noise, c.arm_noise, len(ARM_JOINTS))
        self.data.qpos[self.object_qpos] = obj
        self.data.qpos[self.goal_qpos] = goal
        self.targets = self.data.qpos[self.arm_qpos].copy()
        mujoco.mj_forward(self.model, self.data)
        return self.observation()

    def _placeable(self, obj: np.ndarray, goal: np.ndarray) -> bool:
        c = self.config
        far = np.linalg.norm(goal - obj)
        behind = self.table_origin + obj - c.approach * (goal - obj) / max(far, 1e-9)
        return far > c.min_distance and c.min_reach <= np.linalg.norm(behind - self.shoulder_xy) <= c.max_reach

    def step(self, joint_targets) -> np.ndarray:
        """Hold joint_targets (clipped to the joints' ranges) for one control period."""
        t = np.asarray(joint_targets, np.float64)
        if t.shape != (len(ARM_JOINTS),) or not np.isfinite(t).all():
            raise ValueError(f"joint targets must be {len(ARM_JOINTS)} finite values, got {t!r}")
        self.targets = np.clip(t, self.joint_range[:, 0], self.joint_range[:, 1])
        c, d = self.config, self.data
        for _ in range(c.substeps):
            torque = c.kp * (self.targets - d.qpos[self.arm_qpos]) - c.kd * d.qvel[self.arm_qvel]
            d.ctrl[self.actuator_of_joint] = torque
            mujoco.mj_step(self.model, d)
        mujoco.mj_kinematics(self.model, d)  # body positions of the state just reached, for the observation
        return self.observation()

    # ---- what the policy sees -------------------------------------------------------------------------------
    def observation(self) -> np.ndarray:
        d = self.data
        return np.concatenate([d.qpos[self.arm_qpos], d.qvel[self.arm_qvel], d.xpos[self.hand_body],
                               d.xpos[self.object_body][:2], d.xpos[self.goal_body][:2]])

    def joint_positions(self) -> np.ndarray:
        return self.data.qpos[self.arm_qpos].copy()

    def joint_velocities(self) -> np.ndarray:
        return self.data.qvel[self.arm_qvel].copy()

    def object_to_goal(self) -> float:
        d = self.data
        return float(np.linalg.norm(d.xpos[self.object_body][:2] - d.xpos[self.goal_body][:2]))

    def success(self) -> bool:
        return self.object_to_goal() <= self.config.success_radius

    @property
    def time_ns(self) -> int:
        return int(round(self.data.time * 1e9))

    # ---- the world's capsule --------------------------------------------------------------------------------
    def state(self) -> bytes:
        """The full physics state (mjSTATE_INTEGRATION) and the held joint targets, as bytes."""
        buf = np.empty(self._state_size, np.float64)
        mujoco.mj_getState(self.model, self.data, buf, STATE_SPEC)
        return buf.tobytes() + self.targets.astype(np.float64).tobytes()

    def set_state(self, blob: bytes) -> None:
        want = 8 * (self._state_size + len(ARM_JOINTS))
        if len(blob) != want:
            raise ValueError(f"a world state of this model is {want} bytes, got {len(blob)}")
        arr = np.frombuffer(blob, np.float64)
        mujoco.mj_setState(self.model, self.data, arr[:self._state_size].copy(), STATE_SPEC)
        self.targets = arr[self._state_size:].copy()
        mujoco.mj_forward(self.model, self.data)
