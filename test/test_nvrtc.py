"""NVRTC compiles every kernels/*.cu for the robot (sm_87, Jetson Orin) and sm_90, exactly as CuPy's
RawModule(code=...) does. Needs no GPU: cupy-cuda12x + nvidia-cuda-nvrtc-cu12 from PyPI."""
import pytest

from flashrt_ros.runtime.launch import kernel_dir
from flashrt_ros.runtime.nvrtc import compile_cubin

SOURCES = sorted(p.name for p in kernel_dir().glob("*.cu"))


@pytest.mark.parametrize("arch", [87, 90])
@pytest.mark.parametrize("source", SOURCES)
def test_kernel_compiles_with_nvrtc(source, arch):
    cubin, log = compile_cubin(kernel_dir() / source, arch)
    assert cubin[:4] == b"\x7fELF", f"{source} sm_{arch}: not a cubin\n{log}"


def test_compile_errors_carry_the_compiler_log(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('#include "common.cuh"\nextern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n')
    with pytest.raises(RuntimeError, match="undefined_name"):
        compile_cubin(bad, 87, include_dir=kernel_dir())
