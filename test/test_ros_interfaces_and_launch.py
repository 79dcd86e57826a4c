"""flashrt_interfaces builds and imports with the contract's fields; the launch file starts a lifecycle
node with the documented arguments and matches setup.py; conversions refuse what they cannot map."""
import ast
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from launch_subset import NodeAction, declared, resolve

from conftest import ROOT
from flashrt_ros.ros.io.convert import (
    JointNamesMismatch,
    ObservationReader,
    check_file_name,
    float_array_to_obs,
    joint_state_to_obs,
    replan_observations,
)


def test_interfaces_import_with_the_contract_fields():
    from flashrt_interfaces.action import Replan
    from flashrt_interfaces.msg import CapsuleInfo, PolicyStep
    from flashrt_interfaces.srv import ExportCapsule, ListCapsules, Rollback, SetPin

    assert set(CapsuleInfo.get_fields_and_field_types()) == {
        "id", "parent_id", "step", "stamp", "label", "pinned", "nbytes", "resumed"}
    assert PolicyStep.get_fields_and_field_types()["action_chunk"] == "sequence<float>"
    assert Rollback.Request.get_fields_and_field_types() == {"capsule_id": "uint64", "steps_back": "uint32"}
    assert set(ListCapsules.Response.get_fields_and_field_types()) == {
        "success", "message", "capsules", "live_capsule_id", "bytes_used", "bytes_budget", "resumed_from"}
    assert SetPin.Request.get_fields_and_field_types() == {"capsule_id": "uint64", "pin": "boolean"}
    assert set(SetPin.Response.get_fields_and_field_types()) == {"success", "message", "capsule"}
    assert set(ExportCapsule.Response.get_fields_and_field_types()) == {"success", "message", "sha256"}
    assert Replan.Goal.get_fields_and_field_types()["commit_branch"] == "int32"
    # a left-out field is the harmless choice: a what-if, the live state, the node's deadline; a pin
    assert (Replan.Goal().commit_branch, Replan.Goal().capsule_id, Replan.Goal().deadline_ms) == (-1, 0, 0.0)
    assert SetPin.Request().pin is True
    assert set(Replan.Feedback.get_fields_and_field_types()) == {"branches_done", "steps_done", "elapsed_ms"}
    assert {"rejected": "boolean", "steps_done": "uint32"}.items() <= Replan.Result.get_fields_and_field_types().items()


def _launch_tree():
    return ast.parse((ROOT / "launch" / "flashrt.launch.py").read_text())


def _calls(tree, name):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]


def test_launch_file_names_an_installed_executable_and_an_existing_params_file():
    tree = _launch_tree()
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    setup = (ROOT / "setup.py").read_text()
    scripts = re.findall(r'"([\w-]+) = ([\w.]+):(\w+)"', setup)
    assert consts["PACKAGE"] == "flashrt_ros"
    assert consts["EXECUTABLE"] in {name for name, _, _ in scripts}
    assert (ROOT / "config" / consts["PARAMS_FILE"]).exists()
    assert '("share/" + package_name + "/config", glob("config/*.yaml")' in setup  # installed: test_packaging.py
    module = dict((n, m) for n, m, _ in scripts)[consts["EXECUTABLE"]]
    assert (ROOT / (module.replace(".", "/") + ".py")).exists()
    from flashrt_ros.ros.node import NODE_NAME
    assert consts["NODE_NAME"] == NODE_NAME


def _launched(arguments: dict) -> NodeAction:
    (node,) = resolve(ROOT / "launch" / "flashrt.launch.py", arguments, {"flashrt_ros": ROOT})
    return node


def _effective_parameters(node) -> dict:
    """The node's parameters as ROS applies its --params-file entries: in order, a later value wins."""
    out = {}
    for entry in node.parameters:
        if not isinstance(entry, dict):
            entry = yaml.safe_load(Path(entry).read_text())["/**"]["ros__parameters"]
        out.update(entry)
    return out


def test_launch_file_starts_a_lifecycle_node_with_the_documented_arguments():
    tree = _launch_tree()
    arguments = declared(ROOT / "launch" / "flashrt.launch.py", {"flashrt_ros": ROOT})
    assert set(arguments) == {"namespace", "params_file", "autostart", "log_level", "use_sim_time", "persist_dir",
                              "resume", "role", "primary"}
    assert not _calls(tree, "Node"), "a plain Node cannot be driven through lifecycle transitions"
    assert len(_calls(tree, "LifecycleNode")) == 1
    node = _launched({"namespace": "robot1", "log_level": "debug"})
    assert (node.executable, node.name, node.namespace) == ("flashrt_node", "flashrt", "robot1")
    assert node.parameters == [str(ROOT / "config" / "flashrt.yaml")], "nothing given: the params file alone"
    assert node.arguments == ["--ros-args", "--log-level", "debug"]
    given = _launched({"autostart": "false", "use_sim_time": "true", "persist_dir": "/var/lib/flashrt",
                       "resume": "true", "role": "standby", "primary": "/robot1/flashrt"})
    assert given.parameters[1] == {"autostart": False, "use_sim_time": True, "persist_dir": "/var/lib/flashrt",
                                   "resume": True, "role": "standby", "primary": "/robot1/flashrt"}
    doc = ast.get_docstring(tree)
    assert "ros2 lifecycle set /robot1/flashrt configure" in doc and "activate" in doc
    assert "role:=replica primary:=/robot1/flashrt" in doc and "role:=standby" in doc


def test_a_params_file_keeps_its_values_where_no_launch_argument_overrides_them(tmp_path):
    mine = {"role": "standby", "primary": "/robot1/flashrt", "persist_dir": "/var/lib/flashrt", "resume": True,
            "autostart": False, "use_sim_time": True, "kv_window": 512}
    params = tmp_path / "mine.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": mine}}))
    assert _effective_parameters(_launched({"params_file": str(params)})) == mine
    overridden = _effective_parameters(_launched({"params_file": str(params), "role": "replica", "resume": "false"}))
    assert overridden == {**mine, "role": "replica", "resume": False}
    shipped = _effective_parameters(_launched({}))
    assert not {"role", "primary", "persist_dir", "resume", "autostart", "use_sim_time"} & set(shipped), \
        "the shipped file sets none of them: the node's defaults stand"


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


def test_a_joint_state_of_many_names_with_one_twice_is_refused_naming_it():
    # a hostile publisher's 50,000 names: the check is linear (names.count per name took ~25 s here)
    names = [f"j{i}" for i in range(50_000)] + ["j7"]
    with pytest.raises(ValueError, match=r"names joints \['j7'\] more than once"):
        joint_state_to_obs(joint_state(names, [0.0] * len(names), [0.0] * len(names)), 14)


@pytest.mark.parametrize("names, pos, vel, match", [
    (["j0", "j1"], [0.0] * 7, [0.0] * 7, "2 names, 7 positions and 7 velocities"),
    ([f"j{i}" for i in range(14)], [0.0] * 14, [], "14 positions and 0 velocities"),
    ([f"j{i}" for i in range(10)], [0.0] * 10, [0.0] * 4, "10 positions and 4 velocities"),
    ([], [0.0] * 7, [0.0] * 7, "0 names"),
    (["a", "b", "a"], [0.0] * 3, [0.0] * 3, "more than once"),
])
def test_joint_state_whose_names_positions_and_velocities_disagree_is_refused(names, pos, vel, match):
    for joint_names in ((), ("a", "b")):
        with pytest.raises(ValueError, match=match):
            joint_state_to_obs(joint_state(names, pos, vel), len(pos) + len(vel), joint_names)


def test_reader_takes_the_joint_order_from_joint_names_never_from_the_first_message():
    reader = ObservationReader("joint_state", 4)
    assert reader(joint_state(["x", "y"], [1.0, 2.0], [10.0, 20.0])).tolist() == [1.0, 2.0, 10.0, 20.0]
    assert reader(joint_state(["b", "a"], [2.0, 1.0], [20.0, 10.0])).tolist() == [2.0, 1.0, 20.0, 10.0]
    assert reader.joint_names == []  # message order, whoever spoke first
    named = ObservationReader("joint_state", 4, ["a", "b"])
    assert named(joint_state(["b", "a"], [2.0, 1.0], [20.0, 10.0])).tolist() == [1.0, 2.0, 10.0, 20.0]
    with pytest.raises(JointNamesMismatch, match="lacks joints"):
        named(joint_state(["a", "c"], [1.0, 2.0], [10.0, 20.0]))


def test_float_array_and_replan_observation_validation():
    from std_msgs.msg import Float32MultiArray
    assert float_array_to_obs(Float32MultiArray(data=[1.0, 2.0]), 2).dtype == np.float32
    with pytest.raises(ValueError, match="3 values"):
        float_array_to_obs(Float32MultiArray(data=[1.0, 2.0, 3.0]), 2)
    padded = Float32MultiArray(data=[0.0, 1.0])
    padded.layout.data_offset = 1
    with pytest.raises(ValueError, match="data_offset is 1"):
        float_array_to_obs(padded, 2)
    assert replan_observations([0.0] * 24, 2, 3, 4).shape == (2, 3, 4)
    with pytest.raises(ValueError, match="2 x 3 x 4 = 24"):
        replan_observations([0.0] * 23, 2, 3, 4)


@pytest.mark.parametrize("name, ok", [
    ("a.safetensors", True), ("Run_01-b.safetensors", True), ("x" * 128, True),
    ("x" * 129, False), ("x" * 300, False), ("d/e.safetensors", False), ("../x", False), ("/etc/x", False),
    ("", False), ("~x", False), (".", False), ("..", False), (".hidden", False), ("a\nb", False),
    ("a\x00b", False), ("a b", False), ("caf\u00e9", False), ("a\\b", False),
])
def test_capsule_file_names_are_plain_names_of_a_conservative_character_set(name, ok):
    if ok:
        assert check_file_name(name) == name
    else:
        with pytest.raises(ValueError, match="file_name"):
            check_file_name(name)
