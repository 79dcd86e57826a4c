"""The `ros2` commands of the README and of the docs/ pages its sections moved to (doc_pages.PAGES) run as
written, as test_readme.py runs their python blocks.

ros2cli, launch and launch_ros have no wheels here, so each command goes through ros2_cli_subset (the tool's
grammar, run over the same ROS interfaces with rclpy) and `ros2 launch` through launch_subset (the launch file
itself, run with stand-ins for the launch classes). The node is started from the pages' own launch line,
and the commands after it run in page order against it, verbatim: a name outside the namespace, a field
the message lacks or a verb the subset does not know fails the test.
"""
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from doc_pages import ROOT, texts
from launch_subset import LaunchError, resolve
from ros2_cli_subset import GoalAnswer, Ros2, launch_arguments, parse, split_command

pytestmark = pytest.mark.ros

PACKAGE = "flashrt_ros"
STEPS_BEFORE_SERVICES = 25  # docs/ros.md's `rollback {steps_back: 20}` needs that much timeline behind it
WAIT_S = 60.0  # a guard against a hang (the real tools wait forever), not a speed requirement


def bash_commands(markdown: str, page: str) -> list[tuple[str, str]]:
    """("page:line", command) for every `ros2` command in the ```bash blocks, continuation lines kept."""
    out = []
    for block in re.finditer(r"^```bash\n(.*?)^```", markdown, re.M | re.S):
        first_line = markdown.count("\n", 0, block.start(1)) + 1
        lines = block.group(1).split("\n")
        start = 0
        while start < len(lines):
            end = start
            while lines[end].endswith("\\"):
                end += 1
            text = "\n".join(lines[start:end + 1])
            words = split_command(text)
            if "ros2" in words:
                assert words[0] == "ros2", f"{page}:{first_line + start}: a ros2 command this test cannot run " \
                                           f"(write it on its own line): {text!r}"
                out.append((f"{page}:{first_line + start}", text))
            start = end + 1
    return out


def inline_commands(markdown: str) -> list[str]:
    """`ros2 ...` spans in the prose that are whole commands (4 words or more; `ros2 bag play` names a tool)."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return [span for span in re.findall(r"`(ros2 [^`]+)`", prose) if len(split_command(span)) >= 4]


BASH = [command for page, text in texts().items() for command in bash_commands(text, page)]
INLINE = [span for text in texts().values() for span in inline_commands(text)]


def console_scripts() -> set[str]:
    return set(re.findall(r'"([\w-]+) = [\w.]+:\w+"', (ROOT / "setup.py").read_text()))


def launched_nodes(command):
    """The nodes a page's `ros2 launch` line starts (this checkout is the package's share directory, as
    setup.py installs launch/ and config/ there)."""
    assert command.args.package_name == PACKAGE, command.text
    return resolve(ROOT / "launch" / command.args.launch_file_name, launch_arguments(command), {PACKAGE: ROOT})


def test_the_readme_shows_the_ros_surface_commands():
    verbs = {parse(text).verb for _, text in BASH}
    assert {("launch",), ("lifecycle", "set"), ("topic", "pub"), ("service", "call"), ("action", "send_goal")} <= verbs


@pytest.mark.parametrize("line, text", BASH + [(0, span) for span in INLINE], ids=lambda v: str(v)[:40])
def test_every_readme_ros2_command_is_one_the_subset_runs(line, text):
    parse(text)  # UnsupportedCommand names the line's verb or option this test cannot run


@pytest.mark.parametrize("line, text", [(n, t) for n, t in BASH if split_command(t)[1] == "launch"])
def test_every_readme_launch_line_resolves_with_declared_arguments(line, text):
    nodes = launched_nodes(parse(text))
    flashrt = [n for n in nodes if n.package == PACKAGE]
    assert [n.executable for n in flashrt] == ["flashrt_node"], line
    assert "flashrt_node" in console_scripts()


def test_the_nav2_launch_line_hands_the_manager_the_launched_node():
    # nav2_lifecycle_manager is not installable here: its command line is checked, not run
    (text,) = [t for _, t in BASH if "flashrt_nav2.launch.py" in t]
    flashrt, manager = launched_nodes(parse(text))
    assert (flashrt.namespace, manager.namespace) == ("robot1", "robot1")
    assert flashrt.parameters[1]["autostart"] is False
    assert manager.parameters[0]["node_names"] == [f"{flashrt.namespace}/{flashrt.name}"]


@pytest.mark.parametrize("text", [span for span in INLINE if split_command(span)[1] == "run"])
def test_readme_ros2_run_names_an_executable_the_package_installs(text):
    # ros2 run needs a colcon install (lib/flashrt_ros, setup.cfg's script_dir): only the name is checked
    command = parse(text)
    assert command.args.package_name == PACKAGE
    assert command.args.executable_name in console_scripts(), text
    assert "script_dir=$base/lib/flashrt_ros" in (ROOT / "setup.cfg").read_text()


@contextmanager
def started(cmd, env, log_path):
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def under_namespace(text: str, namespace: str) -> str:
    """An inline `ros2 param` command for the default launch (node `/flashrt`), aimed at the node launched
    in `namespace`: the node name is the only word changed."""
    words = split_command(text)
    assert words[3] == "/flashrt", text
    return " ".join([*words[:3], f"/{namespace}/flashrt", *words[4:]])


def readme_session():
    """The pages' commands from the launch line the `ros2 lifecycle set` lines drive, in page order."""
    commands = [(line, parse(text)) for line, text in BASH]
    first_lifecycle = next(i for i, (_, c) in enumerate(commands) if c.verb == ("lifecycle", "set"))
    launch = max(i for i, (_, c) in enumerate(commands[:first_lifecycle]) if c.verb == ("launch",))
    before = [line for line, c in commands[:launch] if c.verb != ("launch",)]
    assert not before, f"commands before the launch line the session starts from would never run: {before}"
    return commands[launch][1], commands[launch + 1:]


def test_readme_ros_commands_run_as_written_against_the_node_the_readme_launches(ros_domain, tmp_path):
    import rclpy

    from flashrt_interfaces.msg import PolicyStep
    from flashrt_ros.ros.io.step_link import policy_step_qos

    launch, commands = readme_session()
    (node,) = launched_nodes(launch)
    executable = str(Path(sys.executable).parent / node.executable)  # the venv's console script
    cmd = node.command(executable, tmp_path)
    env = {**ros_domain, "ROS_HOME": str(tmp_path / "ros_home")}  # capsule_dir: $ROS_HOME/flashrt_capsules
    user = rclpy.create_node("readme_user")
    steps = []
    user.create_subscription(PolicyStep, f"/{node.namespace}/policy_step", steps.append, policy_step_qos(1000))
    ros2 = Ros2(user, timeout=WAIT_S)
    answers = []
    try:
        with started(cmd, env, tmp_path / "node.log") as proc:
            for line, command in commands:
                where = f"{line}: {command.text}"
                if command.verb == ("launch",):
                    continue  # another launch line (resolved in its own test); this test's node stays
                assert proc.poll() is None, f"{where}: the node exited ({proc.returncode})"
                try:
                    answer = ros2.run(command, until=lambda: len(steps) >= STEPS_BEFORE_SERVICES)
                except (AssertionError, TimeoutError, ValueError) as e:
                    pytest.fail(f"{where}\n  {type(e).__name__}: {e}")
                answers.append((where, answer))
                check_answer(where, command, answer)
            for text in [span for span in INLINE if split_command(span)[1] == "param"]:
                answers.append((text, ros2.run(parse(under_namespace(text, node.namespace)))))
        log = (tmp_path / "node.log").read_text()
        assert proc.returncode == 0 and "Traceback" not in log, log[-3000:]
    finally:
        user.destroy_node()
    print("\n".join(f"{where}\n    -> {summary(answer)}" for where, answer in answers))
    assert (tmp_path / "ros_home" / "flashrt_capsules" / "grasp.safetensors").is_file()


def summary(answer) -> str:
    if isinstance(answer, int):
        return f"{answer} messages published"
    if isinstance(answer, GoalAnswer):
        result = answer.result
        return f"accepted={answer.accepted} status={answer.status} feedback={len(answer.feedback or [])} " + (
            f"success={result.success} message={result.message!r}" if result else "")
    if hasattr(answer, "results"):  # SetParameters
        return ", ".join(f"successful={r.successful} {r.reason}" for r in answer.results)
    if hasattr(answer, "descriptors"):
        return "; ".join(f"{d.name}: {d.description}" for d in answer.descriptors)
    if hasattr(answer, "success"):
        return f"success={answer.success} " + (f"message={answer.message!r}" if hasattr(answer, "message") else "")
    return type(answer).__name__


def check_answer(where: str, command, answer) -> None:
    if command.verb == ("topic", "pub"):
        assert answer >= 1, where
    elif command.verb == ("action", "send_goal"):
        assert answer.accepted, f"{where}: goal rejected"
        assert answer.result.success and not answer.result.rejected, f"{where}: {answer.result.message}"
    elif hasattr(answer, "success"):
        assert answer.success, f"{where}: {answer.message}"


def test_the_subset_refuses_what_it_cannot_run_instead_of_skipping_it():
    from ros2_cli_subset import CommandFailed, UnsupportedCommand, fill
    from sensor_msgs.msg import JointState

    from flashrt_interfaces.srv import Rollback
    with pytest.raises(UnsupportedCommand, match="does not know `ros2 topic echo`"):
        parse("ros2 topic echo /robot1/policy_step")
    with pytest.raises(UnsupportedCommand, match="unrecognized arguments: --qos-depth"):
        parse('ros2 topic pub --qos-depth 1 /robot1/observation sensor_msgs/msg/JointState "{}"')
    with pytest.raises(CommandFailed, match="no field 'step_back' in Rollback_Request"):
        fill(Rollback.Request(), {"step_back": 20})
    with pytest.raises(CommandFailed, match="no field 'header.stmp' in Header"):
        fill(JointState(), {"header": {"stmp": {"sec": 1}}})
    assert list(fill(JointState(), {"position": [0, 1]}).position) == [0.0, 1.0]  # YAML ints, as ros2cli takes them
    with pytest.raises(LaunchError, match="declares no argument namspace"):
        launched_nodes(parse("ros2 launch flashrt_ros flashrt.launch.py namspace:=robot1"))
    with pytest.raises(LaunchError, match="'maybe' is not a bool"):
        launched_nodes(parse("ros2 launch flashrt_ros flashrt.launch.py autostart:=maybe"))
