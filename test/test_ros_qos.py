"""QoS the ROS way: qos_overrides in a params file (rclpy's QoSOverridingOptions) change what the node's
endpoints use, seen from the graph and by behaviour; an output bag records the QoS policy_step is offered with."""
import time

import pytest
import yaml

pytestmark = pytest.mark.ros

OVERRIDES = {
    "qos_overrides./test/observation.subscription.reliability": "reliable",
    "qos_overrides./test/action.publisher.reliability": "best_effort",
    "qos_overrides./test/policy_step.publisher.depth": 50,
}


def params_file(tmp_path, values: dict):
    from ros_harness import PARAMS
    base = yaml.safe_load(PARAMS.read_text())
    base["/**"]["ros__parameters"].update(values)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def endpoint_qos(planner, info_fn, topic: str):
    """The QoS of the flashrt node's endpoint on topic, as the graph reports it."""
    end = time.monotonic() + 20
    while time.monotonic() < end:
        infos = [i for i in info_fn(topic) if i.node_name == "flashrt"]
        if infos:
            return infos[0].qos_profile
        planner.spin(0.05)
    raise AssertionError(f"no endpoint of flashrt on {topic}")


def test_params_file_qos_overrides_reach_the_endpoints(ros_domain, tmp_path):
    from rclpy.qos import DurabilityPolicy, ReliabilityPolicy
    from ros_harness import NodeProcess, Planner

    from conftest import observation_trace
    from flashrt_ros.ros.io.step_link import policy_step_qos

    # observation_reliable false would give best effort: the override wins over the shortcut
    proc = NodeProcess(ros_domain, tmp_path / "node.log", params_file=params_file(tmp_path, OVERRIDES),
                       observation_reliable=False, capsule_dir=str(tmp_path / "capsules"))
    planner = Planner()
    try:
        planner.wait_ready()
        node = planner.node
        obs_qos = endpoint_qos(planner, node.get_subscriptions_info_by_topic, "/test/observation")
        action_qos = endpoint_qos(planner, node.get_publishers_info_by_topic, "/test/action")
        step_qos = endpoint_qos(planner, node.get_publishers_info_by_topic, "/test/policy_step")
        assert obs_qos.reliability == ReliabilityPolicy.RELIABLE
        assert action_qos.reliability == ReliabilityPolicy.BEST_EFFORT
        assert action_qos.durability == DurabilityPolicy.VOLATILE  # durability is not overridable
        assert step_qos.durability == DurabilityPolicy.TRANSIENT_LOCAL
        assert step_qos.reliability == policy_step_qos().reliability
        # depth is not in DDS discovery data: it shows in behaviour, the history a late subscriber gets
        for o in observation_trace(60):
            planner.step(o)
        late = []
        node.create_subscription(type(planner.steps[0]), "/test/policy_step", late.append, policy_step_qos(1000))
        end = time.monotonic() + 20
        while len(late) < 50 and time.monotonic() < end:
            planner.spin(0.05)
        planner.spin(0.5)  # anything beyond the 50 would have come with them
        assert [m.step for m in late] == list(range(11, 61))
        from rcl_interfaces.srv import GetParameters
        from ros_harness import call
        values = call(planner, GetParameters, "/test/flashrt/get_parameters", names=list(OVERRIDES)).values
        assert [v.string_value or v.integer_value for v in values] == list(OVERRIDES.values())
        from rcl_interfaces.srv import DescribeParameters
        reliability, depth = call(planner, DescribeParameters, "/test/flashrt/describe_parameters", names=[
            "qos_overrides./test/observation.subscription.reliability",
            "qos_overrides./test/policy_step.publisher.depth"]).descriptors
        assert reliability.read_only and "reliable | best_effort" in reliability.description
        (rng,) = depth.integer_range
        assert (rng.from_value, rng.step) == (1, 1) and "default 10" in depth.description
    finally:
        planner.close()
        assert proc.stop() == 0


def test_output_bag_records_the_policy_step_qos_the_node_offers(tmp_path):
    from fixtures.make_bags import T0_NS, trace, write_joint_messages
    from fixtures.replay_cli import TINY_CONFIG, config_with, replay
    from rclpy.qos import DurabilityPolicy
    from test_replay_outputs import humble_read_metadata

    from flashrt_ros.ros.io.qos import action_default
    from flashrt_ros.ros.io.step_link import policy_step_qos
    obs = trace(5)
    bag = write_joint_messages(tmp_path / "in", obs, [T0_NS + i * 10_000_000 for i in range(5)])
    replay(bag, "--config", config_with(tmp_path, base=TINY_CONFIG), "--out", tmp_path / "out")
    _, profiles = humble_read_metadata(tmp_path / "out")
    for topic, offered in (("/policy_step", policy_step_qos()), ("/action", action_default())):
        (recorded,) = profiles[topic]
        got = (recorded["history"], recorded["depth"], recorded["reliability"], recorded["durability"])
        assert got == (int(offered.history), offered.depth, int(offered.reliability), int(offered.durability)), topic
    assert profiles["/policy_step"][0]["durability"] == int(DurabilityPolicy.TRANSIENT_LOCAL)
