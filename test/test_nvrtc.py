"""NVRTC compiles every kernels/*.cu for the robot (sm_87, Jetson Orin) and sm_90, exactly as CuPy's
RawModule(code=...) does. Needs no GPU: cupy-cuda12x + nvidia-cuda-nvrtc-cu12 from PyPI. cupy is
optional: without it the compile checks skip, saying why."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from flashrt_ros.runtime.engine.launch_table import kernel_dir
from flashrt_ros.runtime.engine.nvrtc import NvrtcUnavailable, compile_cubin, nvrtc_unavailable

SOURCES = sorted(p.name for p in kernel_dir().glob("*.cu"))
needs_cupy = pytest.mark.skipif(nvrtc_unavailable() is not None, reason=str(nvrtc_unavailable()))


@needs_cupy
@pytest.mark.parametrize("arch", [87, 90])
@pytest.mark.parametrize("source", SOURCES)
def test_kernel_compiles_with_nvrtc(source, arch):
    cubin, log = compile_cubin(kernel_dir() / source, arch)
    assert cubin[:4] == b"\x7fELF", f"{source} sm_{arch}: not a cubin\n{log}"


@needs_cupy
def test_compile_errors_carry_the_compiler_log(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('#include "common.cuh"\nextern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n')
    with pytest.raises(RuntimeError, match="undefined_name"):
        compile_cubin(bad, 87, include_dir=kernel_dir())


def test_without_cupy_compiling_fails_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # what `import cupy` sees when it is not installed
    assert "cupy is not installed" in nvrtc_unavailable()
    with pytest.raises(NvrtcUnavailable, match="pip install cupy-cuda12x"):
        compile_cubin(kernel_dir() / SOURCES[0], 87)


def test_without_cupy_the_compile_checks_skip_with_a_reason(tmp_path):
    hidden = tmp_path / "hide" / "cupy"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('cupy hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": str(hidden.parent)}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", __file__,
                          "-k", "compiles_with_nvrtc or carry_the_compiler_log"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    assert f"{2 * len(SOURCES) + 1} skipped" in res.stdout and "cupy is not installed" in res.stdout
