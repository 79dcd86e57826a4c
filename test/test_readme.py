"""The README's examples run as written: every ```python block, and every `make` target it names."""
import re
import subprocess
import sys

import pytest

from conftest import ROOT

README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)


def test_the_readme_has_python_examples():
    assert PYTHON_BLOCKS


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs_as_written(index, tmp_path):
    # A fresh interpreter in an empty directory: only what the block itself imports and defines.
    res = subprocess.run([sys.executable, "-c", PYTHON_BLOCKS[index]], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, f"block {index}:\n{PYTHON_BLOCKS[index]}\n{res.stderr[-3000:]}"


def test_every_make_target_the_readme_names_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"`make ([\w-]+)", README)) | set(re.findall(r"^make ([\w-]+)", README, re.M))
    assert {"demo", "test", "test-compat", "test-jazzy"} <= named
    assert named <= targets, named - targets
