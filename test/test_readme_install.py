"""The README's pip line for a Humble workspace (and docs/operations.md's Jetson line), resolved as pip would
on Ubuntu 22.04: Python 3.10 with the apt numpy 1.21.5 installed. Humble's apt message packages are built
against numpy 1.x and numpy 2 breaks `import sensor_msgs`, so the line must keep numpy below 2 (issue 44.7:
without "numpy<2" pip took numba 0.68.1 and numpy 2.2.6).

Needs the network (pip reaches PyPI): the `network` marker, which `make test` deselects and
`make test-install` runs. Skipped only when no Python 3.10 exists (scripts/find_python.sh says why)."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
from doc_pages import ROOT, joined

pytestmark = pytest.mark.network

UBUNTU_2204_NUMPY = "1.21.5"


def readme_pip_lines() -> list[list[str]]:
    """Every distinct `pip install "safetensors...` command of the pages' code blocks, as pip's arguments."""
    lines = []
    for line in joined().splitlines():
        if re.match(r'^pip install "safetensors', line):
            args = shlex.split(line, comments=True)[2:]
            if args not in lines:
                lines.append(args)
    return lines


def python310() -> str:
    found = subprocess.run([str(ROOT / "scripts" / "find_python.sh"), "3.10"], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip(f"no Python 3.10 to resolve the Humble pip line with: {found.stderr.strip()}")
    return found.stdout.strip()


def version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def test_the_readme_has_the_humble_pip_line():
    lines = readme_pip_lines()
    assert lines and all(any(a.startswith("numba") for a in args) for args in lines), lines


def test_the_humble_pip_line_keeps_numpy_below_2_on_python_310_with_ubuntus_numpy(tmp_path):
    py = python310()
    venv = tmp_path / "humble"
    subprocess.run([py, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", f"numpy=={UBUNTU_2204_NUMPY}"], check=True, timeout=300)
    for args in readme_pip_lines():
        report = tmp_path / "report.json"
        done = subprocess.run([*pip, "install", "--dry-run", "--report", str(report), *args], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"]
                  for i in json.loads(report.read_text())["install"]}
        numpy = chosen.get("numpy", UBUNTU_2204_NUMPY)  # not in the report: the installed one stays
        print(f"{shlex.join(args)}: numpy {numpy}, numba {chosen.get('numba')}", file=sys.stderr)
        assert version(numpy) < (2,), (args, chosen)
        assert "numba" in chosen and version(chosen["numba"]) >= (0, 60), (args, chosen)
