"""Forged state through a real node (issue 15, 7.4 and 7.21): a forged capsule file is refused at import, a
state that makes the action non-finite never reaches /action (diagnostics ERROR and a log line say why),
a node with capsule_hmac_key_file imports only files signed with its key, a dead export's temporary is
swept at configure, and a NUL in a file name is refused before the wire cuts the name short."""
import os
import subprocess
import sys

import numpy as np
import pytest
from capsule_craft import craft, read_capsule
from ros_harness import Diagnostics, joint_state

from conftest import observation_trace

pytestmark = pytest.mark.ros
KEY = b"0123456789abcdef0123456789abcdef\n"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def node_params(request, tmp_path):
    capsules = tmp_path / "capsules"
    capsules.mkdir(mode=0o700)
    if "signed" not in request.node.name:
        return {}
    key = tmp_path / "capsule.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    (capsules / f".killed.safetensors.{_dead_pid()}.tmp").write_bytes(b"x" * 1000)
    (capsules / f".writing.safetensors.{os.getpid()}.tmp").write_bytes(b"x")  # a live process's: kept
    return {"capsule_hmac_key_file": str(key)}


def _actions(planner):
    from std_msgs.msg import Float64MultiArray
    got = []
    sub = planner.node.create_subscription(Float64MultiArray, f"{planner.namespace}/action",
                                           lambda m: got.append(m.data), 100)
    for _ in range(3000):  # matched before the first step, so no action goes by unseen
        if sub.get_publisher_count():
            break
        planner.spin(0.01)
    assert sub.get_publisher_count(), "no publisher of 'action'"
    # The subscriber seeing the publisher does not mean the node's writer has matched this reader yet
    # (discovery is two-sided): step until one action arrives here, then count from zero.
    for o in observation_trace(40)[30:]:
        planner.step(o)
        if planner.spin_until(lambda: got, 2.0):
            break
    assert got, "no action reached the test's subscriber"
    got.clear()
    return got


def test_forged_files_are_refused_and_a_non_finite_action_is_never_published(flashrt, tmp_path):
    proc, planner = flashrt
    actions, diag = _actions(planner), Diagnostics(planner)
    obs = observation_trace(30)
    planner.run(obs[:10])
    good = planner.steps[-1].capsule_id
    exp = planner.client.export_capsule("good.safetensors", good)
    assert exp.success, exp.message
    capsules = tmp_path / "capsules"
    craft(capsules / "good.safetensors", capsules / "extreme.safetensors",
          alter=lambda t: t["mtp_state"].fill(7.4e29))
    craft(capsules / "good.safetensors", capsules / "poison.safetensors",
          alter=lambda t: t["conv_state.0"].fill(3e38))  # finite, unbounded kind: the step overflows

    imp = planner.client.import_capsule("extreme.safetensors", restore=True)
    assert not imp.success and "mtp_state" in imp.message and "7.4e+29" in imp.message
    assert planner.client.list_capsules().live_capsule_id == good

    imp = planner.client.import_capsule("poison.safetensors", restore=True)
    assert imp.success, imp.message
    n = len(planner.steps)
    for o in obs[10:13]:
        planner.publish(joint_state(o, planner.stamp))
    status, values = diag.until(lambda v: int(v["steps_refused"]) >= 3, timeout=60.0)
    assert status.level == status.ERROR and "non-finite action" in status.message
    assert len(planner.steps) == n  # nothing stepped, nothing published
    assert planner.client.list_capsules().live_capsule_id == imp.capsule.id

    assert planner.client.rollback(capsule_id=good).success  # a trusted capsule brings the robot back
    planner.run(obs[10:20])
    for _ in range(1000):  # every step's action, whatever order the two topics arrive in
        if len(actions) >= 20:
            break
        planner.spin(0.01)
    assert len(actions) == 20 and all(np.isfinite(a).all() and np.abs(a).max() <= 1.0 for a in actions)
    assert "non-finite action" in proc.output()

    with pytest.raises(ValueError, match="file_name"):  # the wire would cut it to 'abc'
        planner.client.export_capsule("abc\x00def.safetensors", good)
    assert not (capsules / "abc").exists()


def test_a_signed_node_imports_only_files_with_its_hmac_and_sweeps_dead_exports(flashrt, tmp_path):
    _, planner = flashrt
    capsules = tmp_path / "capsules"
    assert sorted(p.name for p in capsules.iterdir()) == [f".writing.safetensors.{os.getpid()}.tmp"]
    planner.run(observation_trace(8))
    exp = planner.client.export_capsule("signed.safetensors")
    assert exp.success, exp.message
    meta, tensors = read_capsule(capsules / "signed.safetensors")
    assert len(meta["hmac_sha256"]) == 64
    imp = planner.client.import_capsule("signed.safetensors", restore=True)
    assert imp.success, imp.message

    from safetensors.numpy import save
    meta.pop("hmac_sha256")
    (capsules / "unsigned.safetensors").write_bytes(save(tensors, metadata=meta))
    live = planner.client.list_capsules().live_capsule_id
    imp = planner.client.import_capsule("unsigned.safetensors", restore=True)
    assert not imp.success and "no HMAC" in imp.message
    craft(capsules / "signed.safetensors", capsules / "relabelled.safetensors", info={"label": "x"})
    imp = planner.client.import_capsule("relabelled.safetensors", restore=True)
    assert not imp.success and "HMAC mismatch" in imp.message
    assert planner.client.list_capsules().live_capsule_id == live
