"""The node's parameters in rclpy: declared with their descriptions and ranges (params.py holds the table and
the checks), read at configure into a PolicyConfig and the node's own values, and guarded while the node runs.

Every parameter is declared with dynamic typing, so a value of the wrong type never ends in an rclpy traceback
at declaration: the values are checked by name when the node configures (and, for the few live parameters, when
they are set), giving a one-line error that names the parameter.
"""
from __future__ import annotations

import dataclasses

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult
from rclpy.exceptions import InvalidParameterValueException
from rclpy.parameter import Parameter

from ..runtime.model.config import FLOAT32_MAX, PolicyConfig, load_ros_params
from ..runtime.model.policy_file import read_policy, resolve_policy_config
from .io.convert import check_controller_joint_names
from .params import (
    FLOAT_PARAMS,
    INT64_MAX,
    LIVE_PARAMS,
    NODE_PARAMS,
    NODE_RANGES,
    READ_ONLY_NOTE,
    check_deadlines,
    check_node_param,
    number_in,
)


def command_line_overrides(argv, node_name: str) -> dict:
    """``-p name:=value`` of the ROS arguments, typed as rcl types them (YAML). Needed because when a
    params file and ``-p`` give one parameter values of different types (``kv_window: 1024`` in the
    file, ``-p kv_window:=abc``), rcl keeps both and rclpy silently returns the file's: the ``-p``
    value, which must win, would be lost without a word."""
    import yaml

    out, in_ros_args, it = {}, False, iter(argv or ())
    for arg in it:
        if arg == "--ros-args":
            in_ros_args = True
        elif arg == "--":
            in_ros_args = False
        elif in_ros_args and arg in ("-p", "--param"):
            name, sep, text = next(it, "").partition(":=")
            if not sep:
                continue
            prefix, _, name = name.rpartition(":")
            if prefix and prefix.strip("/").split("/")[-1] != node_name:
                continue  # meant for another node
            try:
                out[name] = yaml.safe_load(text) if text else ""
            except yaml.YAMLError:
                out[name] = text
    return out


def params_files(argv) -> list[str]:
    """The ``--params-file`` paths of the ROS arguments, in order (a later one wins, as in rcl)."""
    files, in_ros_args, it = [], False, iter(argv or ())
    for arg in it:
        if arg == "--ros-args":
            in_ros_args = True
        elif arg == "--":
            in_ros_args = False
        elif in_ros_args and arg == "--params-file":
            files.append(next(it, ""))
    return files


def start_up_value(argv, node_name: str, name: str):
    """A node parameter's value before rclpy.init, for what must run before the participant exists (the Fast DDS
    workarounds): ``-p``, else the last params file that sets it, else its default. A value that cannot be read
    here is left to rclpy and configure to report; the default holds until then."""
    default = NODE_PARAMS[name][0]
    value = command_line_overrides(argv, node_name).get(name)
    if value is None:
        for path in params_files(argv):
            try:
                value = load_ros_params(path).get(name, value)
            except Exception:  # noqa: BLE001 - missing or not YAML: rclpy.init names what is wrong with the file
                continue
    try:
        return default if value is None else check_node_param(name, value)
    except ValueError:
        return default


def policy_range(f: dataclasses.Field):
    """A PolicyConfig field's range: its `min`, up to the type's largest value; None for a string."""
    lo = f.metadata.get("min")
    if lo is None:
        return None
    if f.type in ("int", int):
        return int(lo), int(f.metadata.get("max", INT64_MAX))
    return float(lo), float(f.metadata.get("max", FLOAT32_MAX))


def _with_range(descriptor: ParameterDescriptor, lo, hi) -> ParameterDescriptor:
    if isinstance(lo, float):
        descriptor.floating_point_range = [FloatingPointRange(from_value=lo, to_value=hi, step=0.0)]
    else:
        descriptor.integer_range = [IntegerRange(from_value=lo, to_value=hi, step=1)]
    return descriptor


def _declared_value(node, name: str, default, overrides: dict):
    """What the parameter starts with: -p, else the params file, else the default; an integer given for
    a float parameter becomes that float (the parameter stays a double)."""
    if name in overrides:
        value = overrides[name]
    else:
        given = getattr(node, "_parameter_overrides", {}).get(name)  # the params file (rclpy keeps it there)
        value = default if given is None or given.type_ == Parameter.Type.NOT_SET else given.value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return value


def declare_all(node, overrides: dict | None = None) -> None:
    """``overrides``: command_line_overrides(); those values are declared as given (see there)."""
    overrides = overrides or {}

    def declare(name, default, description, read_only, rng):
        value = _declared_value(node, name, default, overrides)
        if name == "replan_max_deadline_ms" and rng is not None:
            try:  # its start-up value is its ceiling: clients may lower it, never raise it past this
                rng = (rng[0], number_in(name, value, *rng))
            except ValueError:
                pass  # configure fails and says why
        def descriptor():
            return ParameterDescriptor(description=description, read_only=read_only, dynamic_typing=True)

        try:
            node.declare_parameter(name, value, _with_range(descriptor(), *rng) if rng else descriptor(),
                                   ignore_override=True)
        except InvalidParameterValueException:  # out of range: configure names it in one line
            node.declare_parameter(name, value, descriptor(), ignore_override=True)

    for f in dataclasses.fields(PolicyConfig):
        declare(f.name, f.default, f.metadata["help"] + READ_ONLY_NOTE, True, policy_range(f))
    for name, (default, help_text, _, live) in NODE_PARAMS.items():
        declare(name, default, help_text + ("" if live else READ_ONLY_NOTE), not live, NODE_RANGES.get(name))


def _declared_range(node, name: str):
    """The range in the parameter's descriptor (replan_max_deadline_ms: up to its start-up value)."""
    d = node.describe_parameter(name)
    if d.floating_point_range:
        return d.floating_point_range[0].from_value, d.floating_point_range[0].to_value
    if d.integer_range:
        return d.integer_range[0].from_value, d.integer_range[0].to_value
    return None


def read_config(node) -> tuple[PolicyConfig, dict]:
    """PolicyConfig and the node's own parameters; ValueError naming the parameter."""
    values = {f.name: _value(node, f.name) for f in dataclasses.fields(PolicyConfig)}
    for f in dataclasses.fields(PolicyConfig):
        rng, v = policy_range(f), values[f.name]
        # a value of the wrong type is left to PolicyConfig, which names the type it expects
        if rng is not None and isinstance(v, type(rng[0])) and not isinstance(v, bool):
            number_in(f.name, v, *rng)
    cfg = PolicyConfig(**values)  # checks types and ranges field by field, naming the field
    cfg = resolve_policy_config(cfg)  # policy_path: the file's architecture (obs_dim, action_dim, ...) from here on
    own = {n: check_node_param(n, _value(node, n)) for n in NODE_PARAMS}
    policy_file = cfg.policy_path or cfg.weights_path
    if policy_file and not own["action_joint_names"]:  # a policy file names its action channels: the joints,
        names = list(read_policy(policy_file).action_names)  # where a controller takes them (a bag's may not)
        try:
            own["action_joint_names"] = check_controller_joint_names("action_names", names) if names else []
        except ValueError:
            pass  # unset: the node warns that the trajectory's joints are unnamed
    ceiling = _declared_range(node, "replan_max_deadline_ms")
    if ceiling is not None:
        number_in("replan_max_deadline_ms", own["replan_max_deadline_ms"], *ceiling)
    check_deadlines(own["replan_deadline_ms"], own["replan_max_deadline_ms"])
    if own["role"] != "primary":
        if not own["primary"].strip():
            raise ValueError(f"primary: role {own['role']} needs the primary node's name, e.g. /robot1/flashrt")
        if own["persist_dir"] or own["resume"]:
            raise ValueError(f"persist_dir: a {own['role']} keeps no capsule log of its own (its store is the "
                             "primary's stream); leave persist_dir empty and resume false")
        own["primary"] = primary_node_name(own["primary"])
    # where a standby steps and publishes, for good (a takeover changes its role, not its topics)
    own["robot_namespace"] = own["primary"].rsplit("/", 1)[0] if own["role"] == "standby" else None
    return cfg, own


def primary_node_name(value: str) -> str:
    """``/robot1/flashrt`` as given; a namespace alone (``/robot1``, ``robot1``) names its node flashrt."""
    name = "/" + value.strip().strip("/")
    return name if name.rsplit("/", 1)[-1] == "flashrt" else f"{name.rstrip('/')}/flashrt"


def _value(node, name: str):
    p = node.get_parameter(name)
    return None if p.type_ == Parameter.Type.NOT_SET else p.value


def _as_double(p: Parameter) -> Parameter:
    if p.name in FLOAT_PARAMS and p.type_ == Parameter.Type.INTEGER:
        return Parameter(p.name, Parameter.Type.DOUBLE, float(p.value))
    return p


def guard_live_params(node) -> None:
    """Read-only parameters are refused by rclpy itself; the live ones get the configure-time check, the
    deadline pair is checked together, and an integer for a double parameter is set as that double."""

    def check(params):
        new = {p.name: p for p in params}
        try:
            for p in params:
                if p.name not in LIVE_PARAMS:
                    continue
                if p.name in FLOAT_PARAMS and p.type_ != Parameter.Type.DOUBLE:
                    # reached only where rclpy has no pre-set callback to convert an integer (Humble)
                    raise ValueError(f"{p.name}: expected a floating point number (e.g. 30.0), got {p.value!r}")
                check_node_param(p.name, None if p.type_ == Parameter.Type.NOT_SET else p.value)
                rng = _declared_range(node, p.name)
                if rng is not None:
                    number_in(p.name, p.value, *rng)
            if {"replan_deadline_ms", "replan_max_deadline_ms"} & new.keys():
                deadline, cap = (float(new[n].value) if n in new else float(node.get_parameter(n).value)
                                 for n in ("replan_deadline_ms", "replan_max_deadline_ms"))
                check_deadlines(deadline, cap)
        except ValueError as e:
            return SetParametersResult(successful=False, reason=str(e))
        return SetParametersResult(successful=True)

    if hasattr(node, "add_pre_set_parameters_callback"):  # rclpy >= Iron
        node.add_pre_set_parameters_callback(lambda params: [_as_double(p) for p in params])
    node.add_on_set_parameters_callback(check)
