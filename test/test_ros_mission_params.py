"""The arm mission's policy node: the parameters flashrt-demo starts it with."""
import yaml

from flashrt_ros.ros.params import NODE_PARAMS
from flashrt_ros.sim.mission import SHIPPED_POLICY
from flashrt_ros.sim.ros_mission import _params


def test_the_arm_missions_node_runs_without_the_capsule_stream_while_the_nodes_default_keeps_it(tmp_path):
    params = yaml.safe_load(_params(str(SHIPPED_POLICY), "cpu", tmp_path).read_text())["/**"]["ros__parameters"]

    assert params["capsule_stream"] is False
    assert NODE_PARAMS["capsule_stream"][0] is True
