"""The QoS of observation, action and policy_step, overridable the ROS way (rclpy's QoSOverridingOptions).

A params file may set, per fully qualified topic (the node's namespace included):

    qos_overrides./robot1/observation.subscription.reliability: reliable   # or best_effort
    qos_overrides./robot1/observation.subscription.depth: 10
    qos_overrides./robot1/action.publisher.reliability: best_effort
    qos_overrides./robot1/policy_step.publisher.depth: 50

history, depth and reliability can be overridden (rclpy's default policies); durability cannot: policy_step
stays transient-local (step_link explains why) and action volatile (a late controller never gets a stale
action). The overrides are read-only parameters of the node, resolved once at configure, so a bad value fails
configure with a message naming it, and the writer policy_step renews after a rollback keeps the same QoS.
"""
from __future__ import annotations

from copy import copy

from rcl_interfaces.msg import IntegerRange, ParameterDescriptor
from rclpy.publisher import Publisher
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.qos_overriding_options import QoSOverridingOptions
from rclpy.subscription import Subscription

from .step_link import policy_step_qos

ACTION_DEPTH = 10
# services (the node's and FlashRTClient's): the requests and replies an endpoint holds before they are taken.
# rmw's default (keep last 10) silently dropped the oldest of a burst: 20 set_pin calls sent at once, then a
# deactivate, and 10 were never answered, their callers waiting for ever
SERVICE_DEPTH = 1000
SERVICE_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=SERVICE_DEPTH, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE)
# observations the subscription keeps for an executor that fell behind: as many as it (4) and the queue a
# replan held them in (4) kept together, before observations were stepped beside replans
OBSERVATION_DEPTH = 8


def observation_default(reliable: bool) -> QoSProfile:
    """Depth OBSERVATION_DEPTH: an executor stalled for a few sensor periods (a loaded CPU) still steps
    every observation, in order. ``observation_reliable`` picks reliable
    (lossless replay) or sensor-data best effort; a qos_overrides reliability wins over it."""
    reliability = ReliabilityPolicy.RELIABLE if reliable else qos_profile_sensor_data.reliability
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=OBSERVATION_DEPTH, reliability=reliability)


def action_default() -> QoSProfile:
    """Volatile: a controller that joins late never gets a stale action."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=ACTION_DEPTH, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


MAX_DEPTH = 100_000
CHOICES = {"reliability": "reliable | best_effort", "history": "keep_last | keep_all"}


def _declare_described(node, entity_type, topic: str, profile: QoSProfile) -> None:
    """The override parameters as rclpy would declare them, with what they accept in the description and
    the depth's range in the descriptor (rclpy's own say neither)."""
    kind = "publisher" if issubclass(entity_type, Publisher) else "subscription"
    prefix = f"qos_overrides.{node.resolve_topic_name(topic)}.{kind}."
    defaults = {"history": profile.history.name.lower(), "depth": profile.depth,
                "reliability": profile.reliability.name.lower()}
    for policy, default in defaults.items():
        if node.has_parameter(prefix + policy):
            continue
        what = CHOICES.get(policy, f"an integer in [1, {MAX_DEPTH}]")
        descriptor = ParameterDescriptor(read_only=True, description=(
            f"{policy} of the {kind} '{node.resolve_topic_name(topic)}': {what} (default {default}); read at "
            "configure, in the params file"))
        if policy == "depth":
            descriptor.integer_range = [IntegerRange(from_value=1, to_value=MAX_DEPTH, step=1)]
        node.declare_parameter(prefix + policy, default, descriptor)


def _overridden(node, entity_type, topic: str, profile: QoSProfile) -> QoSProfile:
    profile = copy(profile)
    try:  # rclpy's own, as create_publisher runs it with qos_overriding_options (Galactic and later)
        from rclpy.qos_overriding_options import _declare_qos_parameters
    except ImportError:
        node.get_logger().warning("this rclpy cannot apply qos_overrides: the default QoS is used")
        return profile
    try:
        _declare_described(node, entity_type, topic, profile)
        _declare_qos_parameters(entity_type, node, node.resolve_topic_name(topic), profile,
                                QoSOverridingOptions.with_default_policies())
    except Exception as e:  # noqa: BLE001 - e.g. 'reliabel': say which parameter, as configure reports it
        raise ValueError(f"qos_overrides for '{node.resolve_topic_name(topic)}': {' '.join(str(e).split())} "
                         f"(reliability: {CHOICES['reliability']}; history: {CHOICES['history']}; depth: an "
                         f"integer in [1, {MAX_DEPTH}])") from None
    if profile.history == HistoryPolicy.KEEP_LAST and profile.depth < 1:
        raise ValueError(f"qos_overrides for '{node.resolve_topic_name(topic)}': depth must be >= 1 with "
                         f"keep_last, got {profile.depth}")
    return profile


def resolve_profiles(node, observation_reliable: bool, trajectory: bool) -> dict[str, QoSProfile]:
    """The QoS each topic is created with: the defaults above, then the params file's qos_overrides."""
    profiles = {
        "observation": _overridden(node, Subscription, "observation", observation_default(observation_reliable)),
        "action": _overridden(node, Publisher, "action", action_default()),
        "policy_step": _overridden(node, Publisher, "policy_step", policy_step_qos()),
    }
    if trajectory:
        profiles["action_trajectory"] = _overridden(node, Publisher, "action_trajectory", action_default())
    return profiles
