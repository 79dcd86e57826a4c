"""LeaderGuard's claim on a real DDS domain (rclpy nodes in this process): sent again while it stands, so a
claim lost on the way does not wait for Fast DDS's next heartbeat (3 s), and no more once it is deposed."""
import time

import pytest

TOPIC = "/robot9/flashrt_leader"


class _Graph:
    """A leader node and a listener node on the test's domain, spun together."""

    def __init__(self):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        from flashrt_interfaces.msg import Leader
        from flashrt_ros.ros.leader import LeaderGuard, leader_qos
        self.leader_node = rclpy.create_node("flashrt", namespace="/robot9")
        self.listener = rclpy.create_node("listener", namespace="/robot9")
        self.heard: list = []  # (receipt time, Leader)
        self.listener.create_subscription(Leader, TOPIC, lambda m: self.heard.append((time.monotonic(), m)),
                                          leader_qos(64))
        self.deposed_by: list = []
        self.guard = LeaderGuard(self.leader_node, TOPIC, self.deposed_by.append)
        self.executor = SingleThreadedExecutor()
        for n in (self.leader_node, self.listener):
            self.executor.add_node(n)

    def spin_until(self, done, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if done():
                return True
            self.executor.spin_once(timeout_sec=0.02)
        return done()

    def wait_matched(self) -> None:
        assert self.spin_until(lambda: self.guard.pub.get_subscription_count() >= 2, 20.0)  # the listener's and its own

    def claims(self, epoch: int) -> list:
        return [m for _, m in self.heard if m.epoch == epoch and m.node == "/robot9/flashrt"]

    def close(self) -> None:
        self.guard.destroy()
        self.executor.shutdown()
        self.leader_node.destroy_node()
        self.listener.destroy_node()


@pytest.fixture
def graph(ros_domain):
    g = _Graph()
    try:
        g.wait_matched()
        yield g
    finally:
        g.close()


def test_a_claim_is_sent_again_until_a_lost_one_would_have_been_repaired(graph):
    from flashrt_ros.ros.leader import CLAIM_RESEND_S
    assert len(CLAIM_RESEND_S) >= 3 and sum(CLAIM_RESEND_S) >= 3.0  # past Fast DDS's heartbeat period (3 s)
    t0 = time.monotonic()
    graph.guard.claim(3, step=40, capsule_id=40)
    sends = 1 + len(CLAIM_RESEND_S)
    assert graph.spin_until(lambda: len(graph.claims(3)) >= sends, 15.0), len(graph.claims(3))
    claims = graph.claims(3)
    assert len({(m.stamp.sec, m.stamp.nanosec, m.step, m.capsule_id) for m in claims}) == 1  # the same claim
    assert (claims[0].step, claims[0].capsule_id) == (40, 40)
    spread = graph.heard[-1][0] - t0
    assert spread >= sum(CLAIM_RESEND_S) * 0.9, spread  # spaced out, not sent in one burst
    graph.spin_until(lambda: False, 0.5)
    assert len(graph.claims(3)) == sends  # and then no more
    assert graph.deposed_by == []


def test_a_deposed_leader_stops_sending_its_claim(graph):
    from flashrt_interfaces.msg import Leader
    from flashrt_ros.ros.leader import CLAIM_RESEND_S, leader_qos
    rival = graph.listener.create_publisher(Leader, TOPIC, leader_qos())
    assert graph.spin_until(lambda: rival.get_subscription_count() >= 2, 20.0)  # matched before the claim
    graph.guard.claim(2, step=10, capsule_id=10)
    assert graph.spin_until(lambda: graph.claims(2), 10.0)
    rival.publish(Leader(stamp=graph.listener.get_clock().now().to_msg(), epoch=3, node="/robot9_standby/flashrt",
                         step=12, capsule_id=12))
    assert graph.spin_until(lambda: graph.deposed_by, 10.0)
    sent_when_deposed = graph.guard.claims_sent
    graph.spin_until(lambda: False, sum(CLAIM_RESEND_S) + 0.5)
    assert graph.guard.claims_sent <= sent_when_deposed + 1  # at most the one between its check and its send
    assert graph.guard.claims_sent < 1 + len(CLAIM_RESEND_S)
    assert len(graph.claims(2)) == graph.guard.claims_sent  # each one sent was heard
    assert graph.guard.epoch == 0 and graph.deposed_by[0].epoch == 3
