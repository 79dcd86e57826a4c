"""The policy_step topic's QoS, and the handshake a client runs before it sends an observation and waits for
that observation's policy_step.

Why transient-local: DDS matches endpoints in each direction on its own. A client can see its observation
publisher matched to the node and its policy_step reader matched to the node's writer while the node's writer
has not matched the reader yet. A volatile writer then drops the first answer, and the client waits forever.
A transient-local writer (the last POLICY_STEP_DEPTH steps) sends it when the match completes. Volatile
subscribers (a controller, ``ros2 topic echo``) are unaffected and never see an old step. The history forgets the
steps of a timeline that was left: the node replaces the writer on a rollback, a reset, a restoring import and while
inactive (FlashRTNode.live_state_replaced: with a spare made ahead, which subscribers have already matched); not
on a committed replan, whose answer must stay inside the replan budget (README, the policy_step row).
The 'action' topic stays volatile: a late controller must never get a stale action. And the history is kept only
POLICY_STEP_LIFESPAN_S (a lifespan, enforced by the writer and the reader): the race above settles in well under a
second, and a subscriber that joins later than that never gets old steps (their actions and chunks) as if new.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import rclpy
from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

POLICY_STEP_DEPTH = 10
POLICY_STEP_LIFESPAN_S = 3.0  # how long the history keeps a step for a subscriber that matches late


def policy_step_qos(depth: int = POLICY_STEP_DEPTH) -> QoSProfile:
    """The node's writer offers this; a client that must see every answer subscribes with it too."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL,
                      lifespan=Duration(nanoseconds=int(POLICY_STEP_LIFESPAN_S * 1e9)))


def _publisher_count(node, subscription) -> int:
    if hasattr(subscription, "get_publisher_count"):  # the matched count, where rclpy has it
        return subscription.get_publisher_count()
    return node.count_publishers(subscription.topic_name)  # the graph count


def wait_linked(node, observation_pub, policy_step_sub, timeout_s: float,
                alive: Callable[[], bool] = lambda: True, subscribers: int = 1) -> None:
    """Spin ``node`` until the observation publisher has ``subscribers`` matched readers and the policy_step
    reader a matched writer. With a standby there are two readers (it holds the observations), and the
    standby's may match first: 1 would let the primary miss the first observations.
    Raises TimeoutError after ``timeout_s``, RuntimeError as soon as ``alive()`` is false."""
    deadline = time.monotonic() + timeout_s
    while observation_pub.get_subscription_count() < subscribers or _publisher_count(node, policy_step_sub) == 0:
        rclpy.spin_once(node, timeout_sec=0.05)
        if not alive():
            raise RuntimeError("the node exited before observation and policy_step were matched")
        if time.monotonic() > deadline:
            raise TimeoutError(f"observation and policy_step were not matched within {timeout_s} s")
