"""The part of the `ros2` command line that README.md uses, done with rclpy.

ros2cli has no wheels on the package index, so the README's commands cannot run through the real tool here.
This is the closest honest stand-in: a command is split as bash splits it, parsed with the tool's grammar
(only the options the README uses), and run over the same ROS interfaces the tool uses:

    ros2 topic pub [-r HZ] TOPIC pkg/msg/Type [YAML]
    ros2 service call NAME pkg/srv/Type [YAML]
    ros2 action send_goal [-f|--feedback] NAME pkg/action/Type YAML
    ros2 lifecycle set NODE LABEL          NODE/get_available_transitions, NODE/change_state
    ros2 param describe NODE NAME...       NODE/describe_parameters
    ros2 param get NODE NAME               NODE/get_parameters
    ros2 param set NODE NAME VALUE         NODE/set_parameters
    ros2 launch PKG FILE [name:=value...]  parsed here, resolved by launch_subset
    ros2 run PKG EXECUTABLE [ARGS...]      parsed here only

Anything else is an UnsupportedCommand, so a README command is never skipped silently. YAML fills a message
as ros2cli's set_message_fields does: an unknown field is an error. Unlike the real tools, every wait has a
timeout (a wrong name would make `ros2 service call` wait forever).
"""
from __future__ import annotations

import argparse
import importlib
import re
import shlex
import time
from dataclasses import dataclass

import yaml


class UnsupportedCommand(ValueError):
    pass


class CommandFailed(AssertionError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UnsupportedCommand(f"{self.prog}: {message}")


def _grammar() -> dict[tuple[str, ...], _Parser]:
    def parser(verb, *positionals, **options):
        p = _Parser(prog="ros2 " + " ".join(verb), add_help=False, allow_abbrev=False)
        for flags, kw in options.items():
            p.add_argument(*flags.split("|"), **kw)
        for name in positionals:  # "name:nargs"
            name, _, nargs = name.partition(":")
            p.add_argument(name, **({"nargs": nargs} if nargs else {}))
        return verb, p

    return dict([
        parser(("topic", "pub"), "topic_name", "message_type", "values:?", **{"-r|--rate": {"type": float}}),
        parser(("service", "call"), "service_name", "service_type", "values:?"),
        parser(("action", "send_goal"), "action_name", "action_type", "goal",
               **{"-f|--feedback": {"action": "store_true"}}),
        parser(("lifecycle", "set"), "node_name", "transition"),
        parser(("param", "describe"), "node_name", "parameter_names:+"),
        parser(("param", "get"), "node_name", "parameter_name"),
        parser(("param", "set"), "node_name", "parameter_name", "value"),
        parser(("launch",), "package_name", "launch_file_name", "launch_arguments:*"),
        parser(("run",), "package_name", "executable_name", f"argv:{argparse.REMAINDER}"),
    ])


GRAMMAR = _grammar()
RESEND_S = 5.0  # a read-only request without an answer this long is sent again (see call)


@dataclass
class Command:
    verb: tuple[str, ...]  # ("service", "call"), ("launch",), ...
    args: argparse.Namespace
    text: str  # as written (continuations joined)


def split_command(text: str) -> list[str]:
    """Words as bash splits them: backslash-newline continues the line (outside single quotes), `#` starts
    a comment."""
    return shlex.split(text.replace("\\\n", ""), comments=True)


def parse(text: str) -> Command:
    argv = split_command(text)
    if argv[:1] != ["ros2"]:
        raise UnsupportedCommand(f"not a ros2 command: {text!r}")
    for verb, parser in GRAMMAR.items():
        if tuple(argv[1:1 + len(verb)]) == verb:
            return Command(verb, parser.parse_args(argv[1 + len(verb):]), text)
    raise UnsupportedCommand(f"ros2_cli_subset does not know `ros2 {' '.join(argv[1:3])}`: {text!r}")


def launch_arguments(command: Command) -> dict[str, str]:
    out = {}
    for arg in command.args.launch_arguments:
        name, sep, value = arg.partition(":=")
        if not sep:
            raise UnsupportedCommand(f"launch argument {arg!r} is not name:=value")
        out[name] = value
    return out


def interface_type(name: str, kind: str):
    """`pkg/kind/Name` -> the rclpy type (kind: msg, srv or action)."""
    parts = name.split("/")
    if len(parts) != 3 or parts[1] != kind:
        raise UnsupportedCommand(f"{name!r}: expected a {kind} type spelled pkg/{kind}/Name")
    try:
        return getattr(importlib.import_module(f"{parts[0]}.{kind}"), parts[2])
    except (ImportError, AttributeError) as e:
        raise CommandFailed(f"{name!r}: no such {kind} type ({e})") from e


def fill(msg, values, where: str = ""):
    """ros2cli's set_message_fields: the YAML mapping into `msg`; an unknown field is an error."""
    if values is None:
        return msg
    if not isinstance(values, dict):
        raise CommandFailed(f"{where or type(msg).__name__}: expected a mapping, got {values!r}")
    fields = msg.get_fields_and_field_types()
    for name, value in values.items():
        if name not in fields:
            raise CommandFailed(f"no field {where + name!r} in {type(msg).__name__} (it has {', '.join(fields)})")
        current = getattr(msg, name)
        if hasattr(current, "get_fields_and_field_types"):
            fill(current, value, f"{where}{name}.")
            continue
        element = re.match(r"(?:sequence<)?([\w/]+)", fields[name]).group(1)
        if "/" in element:
            raise UnsupportedCommand(f"field {where}{name}: sequences of messages are not in this subset")
        if element in ("float", "double"):  # YAML reads `0` as an int; ros2cli converts it
            value = [float(v) for v in value] if isinstance(value, list) else float(value)
        try:
            setattr(msg, name, value)
        except (AssertionError, TypeError, ValueError) as e:
            raise CommandFailed(f"field {where}{name} ({fields[name]}): {value!r} does not fit: {e}") from e
    return msg


def parameter_value(text: str):
    """`ros2 param set`'s VALUE as the tool reads it: YAML, typed by what it parses to."""
    from rcl_interfaces.msg import ParameterType, ParameterValue
    value = yaml.safe_load(text)
    for kind, attr, types in ((ParameterType.PARAMETER_BOOL, "bool_value", bool),
                              (ParameterType.PARAMETER_INTEGER, "integer_value", int),
                              (ParameterType.PARAMETER_DOUBLE, "double_value", float)):
        if type(value) is types:
            return ParameterValue(type=kind, **{attr: value})
    return ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=text)


@dataclass
class GoalAnswer:
    accepted: bool
    status: int = 0
    result: object = None
    feedback: list = None


class Ros2:
    """Runs parsed commands from an rclpy node; each wait ends after `timeout` seconds with TimeoutError."""

    def __init__(self, node, timeout: float = 10.0):
        self.node = node
        self.timeout = timeout

    def run(self, command: Command, until=None):
        """The command's answer: a service response, a GoalAnswer, or (topic pub) the messages published.
        `topic pub` publishes until `until()` is true, as the real tool runs until Ctrl-C."""
        handler = {("topic", "pub"): self._topic_pub, ("service", "call"): self._service_call,
                   ("action", "send_goal"): self._send_goal, ("lifecycle", "set"): self._lifecycle_set,
                   ("param", "describe"): self._param_describe, ("param", "get"): self._param_get,
                   ("param", "set"): self._param_set}.get(command.verb)
        if handler is None:
            raise UnsupportedCommand(f"`ros2 {' '.join(command.verb)}` does not run against a node")
        return handler(command.args, until) if command.verb == ("topic", "pub") else handler(command.args)

    def spin_until(self, done, what: str):
        end = time.monotonic() + self.timeout
        while not done():
            if time.monotonic() > end:
                raise TimeoutError(f"{what}: nothing within {self.timeout} s")
            self._spin_once(0.01)

    def _spin_once(self, seconds: float):
        import rclpy
        rclpy.spin_once(self.node, timeout_sec=seconds)

    def _result(self, future, what: str):
        self.spin_until(future.done, what)
        return future.result()

    def _topic_pub(self, a, until):
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        msg_type = interface_type(a.message_type, "msg")
        msg = fill(msg_type(), yaml.safe_load(a.values or "{}"))
        # ros2 topic pub's default QoS: reliable, volatile, keep last
        pub = self.node.create_publisher(msg_type, a.topic_name, QoSProfile(depth=10,
                                                                             reliability=ReliabilityPolicy.RELIABLE))
        period = 1.0 / (a.rate or 1.0)
        published = 0
        end = time.monotonic() + self.timeout
        try:
            while not (until and until()):
                if time.monotonic() > end:
                    raise TimeoutError(f"ros2 topic pub {a.topic_name}: {published} messages published, "
                                       f"and what they should cause did not happen within {self.timeout} s")
                pub.publish(msg)
                published += 1
                next_at = time.monotonic() + period
                while time.monotonic() < next_at:
                    self._spin_once(max(0.0, next_at - time.monotonic()))
        finally:
            self.node.destroy_publisher(pub)
        return published

    def call(self, srv_type, name: str, request, read_only: bool = False):
        """A read-only request is sent again every RESEND_S without an answer: a server's response writer that
        has not matched this brand-new client yet drops the answer (rmw_fastrtps), and a user would re-run
        a query; a request that changes state is sent once."""
        client = self.node.create_client(srv_type, name)
        try:
            if not client.wait_for_service(timeout_sec=self.timeout):
                raise TimeoutError(f"waiting for service {name}: no server within {self.timeout} s")
            if not read_only:
                return self._result(client.call_async(request), f"answer from {name}")
            end = time.monotonic() + self.timeout
            while True:
                future = client.call_async(request)
                resend_at = min(end, time.monotonic() + RESEND_S)
                while not future.done() and time.monotonic() < resend_at:
                    self._spin_once(0.01)
                if future.done():
                    return future.result()
                client.remove_pending_request(future)
                if time.monotonic() >= end:
                    raise TimeoutError(f"answer from {name}: nothing within {self.timeout} s")
        finally:
            self.node.destroy_client(client)

    def _service_call(self, a):
        srv = interface_type(a.service_type, "srv")
        return self.call(srv, a.service_name, fill(srv.Request(), yaml.safe_load(a.values or "{}")))

    def _send_goal(self, a):
        from rclpy.action import ActionClient
        action = interface_type(a.action_type, "action")
        goal = fill(action.Goal(), yaml.safe_load(a.goal))
        client = ActionClient(self.node, action, a.action_name)
        feedback = []
        try:
            if not client.wait_for_server(timeout_sec=self.timeout):
                raise TimeoutError(f"waiting for action server {a.action_name}: none within {self.timeout} s")
            handle = self._result(client.send_goal_async(
                goal, feedback_callback=feedback.append if a.feedback else None), f"goal response from {a.action_name}")
            if not handle.accepted:
                return GoalAnswer(accepted=False)
            result = self._result(handle.get_result_async(), f"result from {a.action_name}")
            return GoalAnswer(True, result.status, result.result, feedback)
        finally:
            client.destroy()

    def _lifecycle_set(self, a):
        from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions
        available = self.call(GetAvailableTransitions, f"{a.node_name}/get_available_transitions",
                              GetAvailableTransitions.Request(), read_only=True).available_transitions
        by_label = {t.transition.label: t.transition for t in available}
        if a.transition not in by_label:
            raise CommandFailed(f"{a.node_name}: no transition {a.transition!r} from its state "
                                f"(available: {', '.join(by_label)})")
        response = self.call(ChangeState, f"{a.node_name}/change_state", ChangeState.Request(
            transition=by_label[a.transition]))
        if not response.success:
            raise CommandFailed(f"{a.node_name}: transition {a.transition!r} failed")
        return response

    def _param_describe(self, a):
        from rcl_interfaces.msg import ParameterType
        from rcl_interfaces.srv import DescribeParameters
        response = self.call(DescribeParameters, f"{a.node_name}/describe_parameters",
                             DescribeParameters.Request(names=a.parameter_names), read_only=True)
        unset = [d.name or n for n, d in zip(a.parameter_names, response.descriptors)
                 if d.type == ParameterType.PARAMETER_NOT_SET]
        if unset or len(response.descriptors) != len(a.parameter_names):
            raise CommandFailed(f"{a.node_name}: parameter not set: {', '.join(unset) or a.parameter_names}")
        return response

    def _param_get(self, a):
        from rcl_interfaces.msg import ParameterType
        from rcl_interfaces.srv import GetParameters
        response = self.call(GetParameters, f"{a.node_name}/get_parameters",
                             GetParameters.Request(names=[a.parameter_name]), read_only=True)
        if not response.values or response.values[0].type == ParameterType.PARAMETER_NOT_SET:
            raise CommandFailed(f"{a.node_name}: parameter {a.parameter_name} not set")
        return response

    def _param_set(self, a):
        from rcl_interfaces.msg import Parameter
        from rcl_interfaces.srv import SetParameters
        response = self.call(SetParameters, f"{a.node_name}/set_parameters", SetParameters.Request(
            parameters=[Parameter(name=a.parameter_name, value=parameter_value(a.value))]))
        (result,) = response.results
        if not result.successful:
            raise CommandFailed(f"{a.node_name}: setting {a.parameter_name} failed: {result.reason}")
        return response
