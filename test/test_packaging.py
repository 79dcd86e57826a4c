"""Packaging: console scripts land where each install needs them, and package.xml declares what the
code imports (what `rosdep install` reads)."""
import ast
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from doc_pages import joined

from conftest import ROOT

README = joined()  # the README and the docs/ pages its sections moved to
SCRIPTS = re.findall(r'"([\w-]+) = [\w.]+:\w+"', (ROOT / "setup.py").read_text())


def setup_py_install(prefix, env):
    """What colcon's ament_python build runs (setup.cfg is read as on a robot)."""
    work = prefix.parent / "build"
    work.mkdir()
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(work), "build", "--build-base",
                    str(work), "install", "--prefix", str(prefix), "--single-version-externally-managed",
                    "--record", str(work / "install.log")], cwd=ROOT, env=env, check=True, capture_output=True,
                   timeout=300)


def test_colcon_install_puts_console_scripts_where_ros2_run_looks(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DIST_EXTRA_CONFIG"}
    setup_py_install(tmp_path / "install", env)
    for name in SCRIPTS:
        assert (tmp_path / "install" / "lib" / "flashrt_ros" / name).exists(), name
    share = tmp_path / "install" / "share" / "flashrt_ros"
    for f in ("config/flashrt.yaml", "config/fastdds.xml", "launch/flashrt.launch.py", "kernels/common.cuh"):
        assert (share / f).is_file(), f  # what the node, ros2 launch and the CUDA backend look up in the share


def test_venv_install_puts_console_scripts_on_the_path(tmp_path):
    env = {**os.environ, "DIST_EXTRA_CONFIG": str(ROOT / "scripts" / "venv_scripts.cfg")}  # as the Makefile
    setup_py_install(tmp_path / "venv", env)
    for name in SCRIPTS:
        assert (tmp_path / "venv" / "bin" / name).exists(), name


def test_every_command_the_readme_shows_is_installed_in_this_venv():
    shown = set(re.findall(r"\b(flashrt-[a-z]+|flashrt_node)\b", README))
    assert {"flashrt-demo", "flashrt-replay", "flashrt-bench"} <= shown
    assert shown <= set(SCRIPTS), shown - set(SCRIPTS)
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running in a venv: nothing installed to check")
    bindir = os.path.dirname(sys.executable)
    missing = [n for n in shown if not os.access(os.path.join(bindir, n), os.X_OK)]
    assert not missing, f"not in {bindir}: {missing} (make setup installs them there)"


def test_make_help_creates_no_ros_log_dir(tmp_path):
    """Only the targets that start ROS processes make a ROS_LOG_DIR; `make help` leaves nothing."""
    before = set(Path("/tmp").glob("flashrt-roslog.*"))
    env = {k: v for k, v in os.environ.items() if k not in ("ROS_LOG_DIR", "MAKEFLAGS", "MAKELEVEL")}
    res = subprocess.run(["make", "-s", "help"], cwd=ROOT, env={**env, "TMPDIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "make demo" in res.stdout, res.stderr
    assert list(tmp_path.iterdir()) == []
    assert set(Path("/tmp").glob("flashrt-roslog.*")) - before == set()


# Imports that are not ROS packages of the same name: their rosdep keys, or None where no key exists
# and the README says how to install it.
ROSDEP_KEYS = {"numpy": "python3-numpy", "yaml": "python3-yaml", "rosbags": "python3-rosbags-pip",
               "pytest": "python3-pytest", "hypothesis": "python3-hypothesis", "matplotlib": "python3-matplotlib",
               "numba": "python3-numba",
               "llvmlite": "python3-numba",  # numba's own dependency; cpu_simd.py's intrinsics emit its IR
               "safetensors": None,  # pip (README: Dependencies)
               "cupy": None, "cupyx": None,  # optional, backend: cuda (README)
               "ray": None,  # optional, flashrt-replay --ray: pip extra flashrt_ros[ray] (README)
               "torch": None,  # optional, flashrt_ros.train only: pip extra flashrt_ros[train] (README)
               "mujoco": None,  # optional, flashrt_ros.sim only: pip extra flashrt_ros[sim]
               "mcap": None, "mcap_ros2": None,  # test-only independent bag readers, from pip
               # rosbags' own requirements (lz4; backports.zstd, the standard library's compression.zstd
               # from Python 3.14): python3-rosbags-pip installs them with it, and mcap_limits uses them
               # only to stand in for rosbags' decompressors, keeping rosbags' own where one is missing
               "lz4": None, "backports": None, "compression": None,
               # optional, every import guarded by ImportError: machine.py falls back to numpy's config
               "threadpoolctl": None}


def third_party_imports(*dirs) -> set[str]:
    # this package, and the test directory's own helper modules (importable because test/ is on the path)
    local = {"flashrt_ros", "fixtures", "cuda_on_cpu", "test"} | {p.stem for p in (ROOT / "test").glob("*.py")}
    names = set()
    for d in dirs:
        for path in (ROOT / d).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in local and n != "__future__"}


def declared(*tags) -> set[str]:
    root = ET.parse(ROOT / "package.xml").getroot()
    return {e.text.strip() for tag in tags for e in root.iter(tag)}


@pytest.mark.parametrize("dirs, tags", [(("flashrt_ros", "launch"), ("exec_depend", "depend")),
                                        (("test",), ("exec_depend", "depend", "test_depend"))])
def test_package_xml_declares_every_module_the_code_imports(dirs, tags):
    deps = declared(*tags)
    missing = sorted(f"{m} ({ROSDEP_KEYS.get(m, m)})" for m in third_party_imports(*dirs)
                     if ROSDEP_KEYS.get(m, m) is not None and ROSDEP_KEYS.get(m, m) not in deps)
    assert not missing, f"package.xml lacks: {missing}"


def test_dependencies_without_a_rosdep_key_are_explained_in_the_readme():
    assert re.search(r"pip install[^\n]*safetensors", README)
    assert re.search(r'pip install[^\n]*"cupy-cuda12x<14" "numpy<2"', README)


def test_the_mcap_decompressors_come_with_rosbags():
    """lz4 and backports.zstd have no key in package.xml (ROSDEP_KEYS): python3-rosbags-pip brings them."""
    from importlib.metadata import requires
    wanted = {re.split(r"[\s;<>=!~\[]", r)[0].lower() for r in requires("rosbags") or []}
    assert {"lz4", "backports.zstd"} <= wanted, wanted
