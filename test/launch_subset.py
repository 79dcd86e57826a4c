"""`ros2 launch PKG FILE name:=value ...` resolved to the processes it would start, without launch/launch_ros
(they have no wheels here): the launch file itself runs, with recording stand-ins for the classes it imports,
and its arguments are substituted as launch does (each declared default, overridden by name:=value).

Only what this package's launch files use is interpreted: DeclareLaunchArgument, LaunchConfiguration (and its
perform(context)), ParameterValue(value_type=...), PythonExpression, IncludeLaunchDescription
(PythonLaunchDescriptionSource), OpaqueFunction(function=...), Node and LifecycleNode. Another import or action
fails, so a new construct in a launch file breaks the README test instead of being ignored. One deliberate
difference: an argument the file does not declare is an error here (`ros2 launch` would take `namspace:=robot1`
silently and start the node outside the namespace).
"""
from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import yaml

STAND_INS = {
    "launch": ["LaunchDescription"],
    "launch.actions": ["DeclareLaunchArgument", "IncludeLaunchDescription", "OpaqueFunction"],
    "launch.substitutions": ["LaunchConfiguration", "PythonExpression"],
    "launch.launch_description_sources": ["PythonLaunchDescriptionSource"],
    "launch_ros.actions": ["Node", "LifecycleNode"],
    "launch_ros.parameter_descriptions": ["ParameterValue"],
}


class LaunchError(ValueError):
    pass


class Recorded:
    """A launch object as the launch file built it: its arguments, read back by `resolve`."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class _Context:
    """What an OpaqueFunction's function is given: the launch configurations, name -> text."""

    def __init__(self, launch_configurations: dict[str, str]):
        self.launch_configurations = launch_configurations


def _perform(self, context: _Context) -> str:  # LaunchConfiguration.perform
    return context.launch_configurations[self.args[0]]


def _stand_in_modules(share_dirs: dict[str, Path]) -> dict[str, types.ModuleType]:
    modules = {}
    for name, classes in STAND_INS.items():
        modules[name] = types.ModuleType(name)
        for cls in classes:
            methods = {"perform": _perform} if cls == "LaunchConfiguration" else {}
            setattr(modules[name], cls, type(cls, (Recorded,), methods))

    def get_package_share_directory(package):
        if package not in share_dirs:
            raise LaunchError(f"package {package!r} is not installed here")
        return str(share_dirs[package])

    modules["ament_index_python"] = types.ModuleType("ament_index_python")
    modules["ament_index_python.packages"] = types.ModuleType("ament_index_python.packages")
    modules["ament_index_python.packages"].get_package_share_directory = get_package_share_directory
    return modules


def _description(path: Path, share_dirs: dict[str, Path]) -> list:
    spec = importlib.util.spec_from_file_location(f"launch_file_{path.name.split('.')[0]}", path)
    module = importlib.util.module_from_spec(spec)
    stand_ins = _stand_in_modules(share_dirs)
    before = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec.loader.exec_module(module)
        (entities,) = module.generate_launch_description().args
    finally:  # the real modules (ament_index_python is installed) come back
        for name, previous in before.items():
            if previous is None:
                del sys.modules[name]
            else:
                sys.modules[name] = previous
    return entities


@dataclass
class NodeAction:
    """A Node / LifecycleNode with its substitutions performed."""

    package: str
    executable: str
    name: str
    namespace: str
    parameters: list  # params-file paths and dicts of typed values, in order
    arguments: list[str]

    def command(self, executable_path: str, params_dir: Path) -> list[str]:
        """The command line launch_ros builds: the executable and its `arguments`, then --ros-args with the
        node's name, its namespace made absolute, and one --params-file per `parameters` entry (a dict goes
        to a file under `/**`, as launch_ros writes it)."""
        cmd = [executable_path, *self.arguments, "--ros-args"]
        if self.name:
            cmd += ["-r", f"__node:={self.name}"]
        if self.namespace.strip("/"):
            cmd += ["-r", f"__ns:=/{self.namespace.strip('/')}"]
        for i, entry in enumerate(self.parameters):
            if isinstance(entry, dict):
                path = params_dir / f"{self.name or self.executable}_params_{i}.yaml"
                path.write_text(yaml.safe_dump({"/**": {"ros__parameters": entry}}))
                entry = str(path)
            cmd += ["--params-file", entry]
        return cmd


def declared(launch_file: Path, share_dirs: dict[str, Path]) -> dict[str, str | None]:
    """The launch arguments `launch_file` declares: name -> default (None: none)."""
    return _declared(_description(launch_file, share_dirs))


def _declared(entities) -> dict[str, str | None]:
    return {e.args[0]: e.kwargs.get("default_value") for e in entities if type(e).__name__ == "DeclareLaunchArgument"}


def resolve(launch_file: Path, arguments: dict[str, str], share_dirs: dict[str, Path]) -> list[NodeAction]:
    """The nodes `ros2 launch` would start from `launch_file` with `arguments` (name -> value)."""
    entities = _description(launch_file, share_dirs)
    declared = _declared(entities)
    unknown = sorted(set(arguments) - set(declared))
    if unknown:
        raise LaunchError(f"{launch_file.name} declares no argument {', '.join(unknown)} "
                          f"(it declares {', '.join(declared)})")
    config = {name: arguments.get(name, default) for name, default in declared.items()}
    unset = [name for name, value in config.items() if value is None]
    if unset:
        raise LaunchError(f"{launch_file.name}: argument {', '.join(unset)} has no default: give name:=value")
    return _nodes(launch_file, entities, config, share_dirs)


def _nodes(launch_file: Path, entities: list, config: dict[str, str], share_dirs: dict[str, Path]) -> list[NodeAction]:
    nodes = []
    for entity in entities:
        kind = type(entity).__name__
        if kind == "DeclareLaunchArgument":
            continue
        if kind == "OpaqueFunction":  # launch calls it with the context once the arguments are known
            nodes += _nodes(launch_file, entity.kwargs["function"](_Context(config)), config, share_dirs)
            continue
        if kind in ("Node", "LifecycleNode"):
            kw = entity.kwargs
            nodes.append(NodeAction(
                package=kw["package"], executable=kw["executable"], name=_value(kw.get("name", ""), config),
                namespace=_value(kw.get("namespace", ""), config),
                parameters=[_value(p, config) for p in kw.get("parameters", [])],
                arguments=[_value(a, config) for a in kw.get("arguments", [])]))
        elif kind == "IncludeLaunchDescription":
            (source,) = entity.args
            included = Path(_value(source.args[0], config))
            args = {name: _value(v, config) for name, v in entity.kwargs.get("launch_arguments", ())}
            nodes += resolve(included, args, share_dirs)
        else:
            raise LaunchError(f"{launch_file.name}: launch_subset does not interpret {kind}")
    return nodes


def _value(x, config: dict[str, str]):
    kind = type(x).__name__
    if isinstance(x, (str, bool, int, float)):
        return x
    if isinstance(x, list):
        return [_value(v, config) for v in x]
    if isinstance(x, dict):
        return {k: _value(v, config) for k, v in x.items()}
    if kind == "LaunchConfiguration":
        return config[x.args[0]]
    if kind == "PythonExpression":  # its list of substitutions is one expression
        return str(eval("".join(_value(v, config) for v in x.args[0]), {}))  # this repository's own launch file
    if kind == "ParameterValue":  # launch_ros reads the text as YAML and checks the type it asks for
        text = _value(x.args[0], config)
        wanted = x.kwargs.get("value_type", str)
        value = text if wanted is str else yaml.safe_load(text)
        if type(value) is not wanted:
            raise LaunchError(f"{text!r} is not a {wanted.__name__}")
        return value
    raise LaunchError(f"launch_subset does not interpret {kind}")
