"""Compile a kernels/*.cu file to a cubin with NVRTC, the way CuPy's RawModule(code=...) does.

Used by the CI check for the robot's arch (sm_87) and sm_90; needs cupy + NVRTC, not a GPU.
cupy is optional: without it compile_cubin raises NvrtcUnavailable, and nvrtc_unavailable() says why.
"""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

from ..model.kernel_spec import cuda_defines
from .launch_table import kernel_dir

NVRTC_OPTIONS = ("--device-as-default-execution-space", "-std=c++17")


class NvrtcUnavailable(RuntimeError):
    """cupy (the optional CUDA dependency) is not installed, so nothing can be compiled here."""


def nvrtc_unavailable() -> str | None:
    """None when cupy can be imported; otherwise the reason, for a skip or an error message."""
    try:
        import cupy.cuda.compiler  # noqa: F401
    except ImportError as e:
        return f"cupy is not installed (optional: pip install cupy-cuda12x, see README): {e}"
    return None


def _preload_pip_nvrtc() -> None:
    """cupy 13 opens libnvrtc.so.12 by name, so pip's nvidia-cuda-nvrtc-cu12 is found only through
    LD_LIBRARY_PATH; loading it by path first makes that name resolve. cupy 14 finds it by itself."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except ImportError:
        return
    for d in (spec.submodule_search_locations or []) if spec else []:
        libs = sorted(Path(d, "lib").glob("libnvrtc.so.*"))
        if libs:
            ctypes.CDLL(str(libs[0]), mode=ctypes.RTLD_GLOBAL)
            return


def compile_cubin(source: str | Path, arch: int, include_dir: str | Path | None = None) -> tuple[bytes, str]:
    """Returns (cubin bytes, log). Raises RuntimeError with the compiler log on failure, and
    NvrtcUnavailable (a RuntimeError) when cupy is not installed."""
    reason = nvrtc_unavailable()
    if reason:
        raise NvrtcUnavailable(reason)
    from cupy.cuda import compiler

    _preload_pip_nvrtc()
    source = Path(source)
    inc = Path(include_dir) if include_dir else kernel_dir()
    opts = (f"-arch=sm_{arch}", *NVRTC_OPTIONS, f"-I{inc}", *cuda_defines())
    prog = compiler._NVRTCProgram(source.read_text(), source.name, method="cubin")
    try:
        cubin, _ = prog.compile(opts)
    except compiler.CompileException as e:
        raise RuntimeError(f"NVRTC failed for {source.name} sm_{arch}:\n{e}") from None
    return cubin, "ok"
