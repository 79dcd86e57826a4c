"""flashrt_interfaces builds and imports with the contract's fields; the launch file matches setup.py."""
import ast
import re

import numpy as np
import pytest

from conftest import ROOT
from flashrt_ros.ros.convert import float_array_to_obs, joint_state_to_obs, replan_observations, safe_relative_path


def test_interfaces_import_with_the_contract_fields():
    from flashrt_interfaces.action import Replan
    from flashrt_interfaces.msg import CapsuleInfo, PolicyStep
    from flashrt_interfaces.srv import ExportCapsule, ListCapsules, Rollback

    assert set(CapsuleInfo.get_fields_and_field_types()) == {
        "id", "parent_id", "step", "stamp", "label", "pinned", "nbytes"}
    assert PolicyStep.get_fields_and_field_types()["action_chunk"] == "sequence<float>"
    assert Rollback.Request.get_fields_and_field_types() == {"capsule_id": "uint64", "steps_back": "uint32"}
    assert set(ListCapsules.Response.get_fields_and_field_types()) == {
        "capsules", "live_capsule_id", "bytes_used", "bytes_budget"}
    assert set(ExportCapsule.Response.get_fields_and_field_types()) == {"success", "message", "sha256"}
    assert Replan.Goal.get_fields_and_field_types()["commit_branch"] == "int32"
    assert set(Replan.Feedback.get_fields_and_field_types()) == {"branches_done", "steps_done", "elapsed_ms"}
    assert {"rejected": "boolean", "steps_done": "uint32"}.items() <= Replan.Result.get_fields_and_field_types().items()


def test_launch_file_names_an_installed_executable_and_an_existing_params_file():
    tree = ast.parse((ROOT / "launch" / "flashrt.launch.py").read_text())
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    setup = (ROOT / "setup.py").read_text()
    scripts = re.findall(r'"([\w-]+) = ([\w.]+):(\w+)"', setup)
    assert consts["PACKAGE"] == "flashrt_ros"
    assert consts["EXECUTABLE"] in {name for name, _, _ in scripts}
    assert (ROOT / "config" / consts["PARAMS_FILE"]).exists()
    assert '("share/" + package_name + "/config", glob("config/*.yaml"))' in setup
    module = dict((n, m) for n, m, _ in scripts)[consts["EXECUTABLE"]]
    assert (ROOT / (module.replace(".", "/") + ".py")).exists()


def joint_state(names, pos, vel):
    from sensor_msgs.msg import JointState
    return JointState(name=names, position=pos, velocity=vel)


def test_joint_state_conversion_orders_by_joint_names():
    msg = joint_state(["b", "a"], [2.0, 1.0], [20.0, 10.0])
    assert joint_state_to_obs(msg, 4).tolist() == [2.0, 1.0, 20.0, 10.0]
    assert joint_state_to_obs(msg, 4, ["a", "b"]).tolist() == [1.0, 2.0, 10.0, 20.0]
    with pytest.raises(ValueError, match="lacks joints"):
        joint_state_to_obs(msg, 4, ["a", "c"])
    with pytest.raises(ValueError, match="obs_dim is 6"):
        joint_state_to_obs(msg, 6)
    with pytest.raises(ValueError, match="non-finite"):
        joint_state_to_obs(joint_state(["a"], [float("inf")], [0.0]), 2)


def test_float_array_and_replan_observation_validation():
    from std_msgs.msg import Float32MultiArray
    assert float_array_to_obs(Float32MultiArray(data=[1.0, 2.0]), 2).dtype == np.float32
    with pytest.raises(ValueError, match="3 values"):
        float_array_to_obs(Float32MultiArray(data=[1.0, 2.0, 3.0]), 2)
    assert replan_observations([0.0] * 24, 2, 3, 4).shape == (2, 3, 4)
    with pytest.raises(ValueError, match="2 x 3 x 4 = 24"):
        replan_observations([0.0] * 23, 2, 3, 4)


@pytest.mark.parametrize("name, ok", [("a.safetensors", True), ("d/e/f.safetensors", True), ("./x", True),
                                      ("../x", False), ("a/../../x", False), ("/etc/x", False), ("", False),
                                      ("~/x", False)])
def test_capsule_file_names_stay_inside_capsule_dir(name, ok):
    if ok:
        assert ".." not in safe_relative_path(name)
    else:
        with pytest.raises(ValueError):
            safe_relative_path(name)
