"""A field left out of a goal or request means the harmless thing. Over the wire a left-out field is
its IDL default (what `Replan.Goal()` and `ros2 action send_goal ... "{...}"` send), so each default
must never move the robot: a Replan without commit_branch is a what-if, a Rollback without a target
is refused, a SetPin without `pin` pins. Checked against a real node process, byte for byte.

The node takes a capsule every 3rd step, so the live step can be past the live capsule: there a
Rollback that says nothing would move the robot back (to the last capsule)."""
import numpy as np
import pytest
import yaml
from ros_harness import call, reference_session

from conftest import observation_trace

pytestmark = pytest.mark.ros
EVERY_N = 3


@pytest.fixture
def node_params():
    return {"capsule_every_n_steps": EVERY_N}


def from_yaml(msg_type, text: str):
    """A message as `ros2 action send_goal` / `ros2 service call` build it from their YAML argument
    (rosidl_runtime_py.set_message_fields): the type's default, then each field the YAML names."""
    msg = msg_type()
    for name, value in yaml.safe_load(text).items():
        setattr(msg, name, value)
    return msg


class Live:
    """The node's live state as a planner sees it: the live capsule, its bytes, and the action the
    next observation gets, compared with a reference Session that saw the same observations."""

    def __init__(self, planner):
        self.planner, self.ref = planner, reference_session(capsule_every_n_steps=EVERY_N)
        self.obs = observation_trace(200, seed=3)
        self.n = 0

    def run(self, k: int) -> None:
        got = self.planner.run(self.obs[self.n:self.n + k])
        want = np.stack([self.ref.step(o).action for o in self.obs[self.n:self.n + k]])
        assert got.tobytes() == want.tobytes()
        self.n += k

    def view(self, name: str):
        listed = self.planner.client.list_capsules()
        assert listed.success, listed.message
        exported = self.planner.client.export_capsule(f"{name}.safetensors")  # 0: the live capsule
        assert exported.success, exported.message
        return listed.live_capsule_id, exported.sha256, len(listed.capsules)

    def assert_unchanged(self, before, name: str) -> None:
        """Same live capsule, same bytes, no capsule added, and the next step continues the live
        timeline exactly (number and action bytes)."""
        assert self.view(name) == before
        step = self.planner.step(self.obs[self.n])
        want = self.ref.step(self.obs[self.n])
        self.n += 1
        assert step.step == self.ref.step_count == self.n
        assert np.asarray(step.action, np.float32).tobytes() == want.action.tobytes()


def test_a_replan_goal_without_commit_branch_is_a_what_if_and_leaves_the_live_state_byte_identical(flashrt):
    from flashrt_interfaces.action import Replan
    _, planner = flashrt
    live = Live(planner)
    live.run(7)
    branches = np.stack([observation_trace(4, seed=9) + 0.1 * b for b in range(2)]).astype(np.float32)
    built = Replan.Goal(branches=2, horizon=4, observations=branches.ravel().tolist())
    text = ("{capsule_id: 0, branches: 2, horizon: 4, observations: [" +
            ", ".join(repr(float(v)) for v in branches.ravel()) + "]}")
    for how, goal in (("Replan.Goal()", built), ("YAML without commit_branch", from_yaml(Replan.Goal, text))):
        before = live.view(f"before_{len(how)}")
        out = planner.client.send_goal(goal)
        assert out.accepted and out.succeeded, (how, out.reason)
        assert out.result.steps_done == 4 and len(out.result.branch_capsule_ids) == 2
        assert out.result.live_capsule_id == before[0], f"{how}: a goal without commit_branch committed a branch"
        # the what-if's branch capsules are in the store: the capsule count is compared before them
        listed = planner.client.list_capsules()
        for cid in out.result.branch_capsule_ids:
            assert planner.client.drop_capsule(cid).success
        assert len(listed.capsules) == before[2] + 2
        live.assert_unchanged(before, f"after_{len(how)}")
    assert Replan.Goal().commit_branch == -1 and Replan.Goal().capsule_id == 0 and Replan.Goal().deadline_ms == 0


def test_a_rollback_request_that_names_no_target_is_refused_and_changes_nothing(flashrt):
    from flashrt_interfaces.srv import Rollback
    _, planner = flashrt
    live = Live(planner)
    live.run(7)  # capsules after steps 3 and 6: the live step (7) is past the live capsule
    assert Rollback.Request().capsule_id == 0 and Rollback.Request().steps_back == 0
    for how, fields in (("Rollback.Request()", {}), ("YAML {}", yaml.safe_load("{}"))):
        before = live.view(f"before_{len(how)}")
        r = call(planner, Rollback, "rollback", **fields)
        assert not r.success and "steps_back" in r.message and "capsule_id" in r.message, (how, r.message)
        live.assert_unchanged(before, f"after_{len(how)}")
    # naming the target still works: the live capsule itself, or steps back from the live step
    r = planner.client.rollback(steps_back=2)
    assert r.success and r.capsule.step == 6, r.message


def test_a_set_pin_request_without_pin_pins(flashrt):
    from flashrt_interfaces.srv import SetPin
    _, planner = flashrt
    live = Live(planner)
    live.run(6)
    cid = planner.client.list_capsules().live_capsule_id
    assert SetPin.Request().pin is True
    r = call(planner, SetPin, "set_pin", **yaml.safe_load(f"{{capsule_id: {cid}}}"))
    assert r.success and r.capsule.pinned, r.message
    assert [c.id for c in planner.client.list_capsules(pinned_only=True).capsules] == [cid]
