"""Node parameters: every PolicyConfig field plus the node's own, each with a description."""
from __future__ import annotations

import dataclasses
import math

from rcl_interfaces.msg import FloatingPointRange, ParameterDescriptor, SetParametersResult
from rclpy.exceptions import ParameterUninitializedException
from rclpy.parameter import Parameter

from ..runtime.config import PolicyConfig

# name: (default, description, changeable while configured)
NODE_PARAMS = {
    "backend": ("auto", "auto | numpy | cuda: 'auto' takes CUDA when CuPy has a usable device", False),
    "observation_type": ("joint_state", "joint_state (sensor_msgs/JointState) | float32_array "
                         "(std_msgs/Float32MultiArray)", False),
    "joint_names": (Parameter.Type.STRING_ARRAY, "order in which JointState positions, then velocities, fill "
                    "the observation; empty = message order", False),
    "observation_reliable": (False, "reliable QoS on 'observation' (lossless replay); false = sensor-data "
                             "(best effort). Depth 4 either way, as during a replan: the 4 newest wait, the oldest is "
                             "dropped first", False),
    "replan_deadline_ms": (50.0, "default Replan deadline when a goal says 0", True),
    "replan_max_deadline_ms": (200.0, "longest deadline a Replan goal may ask for; a goal over it is rejected "
                               "(one replan runs at a time, so this bounds how long a goal occupies it)", True),
    "step_deadline_ms": (10.0, "a step slower than this is counted and warned about", True),
    "capsule_dir": ("/tmp/flashrt_capsules", "directory for export_capsule / import_capsule file names", True),
    "diagnostics_period_s": (1.0, "period of /diagnostics", False),
    "autostart": (True, "configure and activate on start-up, without a lifecycle manager", False),
}
READ_ONLY_WHEN_CONFIGURED = {f.name for f in dataclasses.fields(PolicyConfig)} | {
    n for n, (_, _, live) in NODE_PARAMS.items() if not live}


def declare_all(node) -> None:
    for f in dataclasses.fields(PolicyConfig):
        default = f.default
        desc = ParameterDescriptor(description=f.metadata["help"])
        if isinstance(default, float) and "min" in f.metadata:
            desc.floating_point_range = [FloatingPointRange(from_value=float(f.metadata["min"]),
                                                            to_value=float("inf"), step=0.0)]
        node.declare_parameter(f.name, default, desc)
    for name, (default, help_text, _) in NODE_PARAMS.items():
        node.declare_parameter(name, default, ParameterDescriptor(description=help_text))


def read_config(node) -> tuple[PolicyConfig, dict]:
    """PolicyConfig (ValueError naming the field) and the node's own parameters."""
    values = {f.name: node.get_parameter(f.name).value for f in dataclasses.fields(PolicyConfig)}
    for f in dataclasses.fields(PolicyConfig):  # YAML may give 768 for a float field
        if f.type in ("float", float) and isinstance(values[f.name], int):
            values[f.name] = float(values[f.name])
    cfg = PolicyConfig(**values)
    own = {n: _value_or_none(node, n) for n in NODE_PARAMS}
    own["joint_names"] = list(own["joint_names"] or [])
    if own["backend"] not in ("auto", "numpy", "cuda"):
        raise ValueError(f"backend: expected auto, numpy or cuda, got {own['backend']!r}")
    if own["observation_type"] not in ("joint_state", "float32_array"):
        raise ValueError(f"observation_type: expected joint_state or float32_array, got {own['observation_type']!r}")
    for name in ("replan_deadline_ms", "replan_max_deadline_ms", "step_deadline_ms", "diagnostics_period_s"):
        if not (isinstance(own[name], (int, float)) and math.isfinite(own[name]) and own[name] > 0):
            raise ValueError(f"{name}: must be a positive number, got {own[name]!r}")
    return cfg, own


def _value_or_none(node, name: str):
    try:
        return node.get_parameter(name).value
    except ParameterUninitializedException:  # a typed parameter with no value (joint_names by default)
        return None


def guard_read_only(node, is_configured) -> None:
    """Refuse changes that would need a new allocation / capture while configured."""

    def check(params):
        if is_configured():
            frozen = [p.name for p in params if p.name in READ_ONLY_WHEN_CONFIGURED]
            if frozen:
                return SetParametersResult(successful=False, reason=f"{frozen} are read-only while configured "
                                           "(they size buffers or the captured graph); clean up first")
        for p in params:
            if p.name in ("replan_deadline_ms", "replan_max_deadline_ms", "step_deadline_ms") \
                    and not (p.value and p.value > 0):
                return SetParametersResult(successful=False, reason=f"{p.name} must be > 0")
        return SetParametersResult(successful=True)

    node.add_on_set_parameters_callback(check)
