"""Compile a kernels/*.cu file to a cubin with NVRTC, the way CuPy's RawModule(code=...) does.

Used by the CI check for the robot's arch (sm_87) and sm_90; needs cupy + NVRTC, not a GPU.
"""
from __future__ import annotations

from pathlib import Path

from .launch import kernel_dir

NVRTC_OPTIONS = ("--device-as-default-execution-space", "-std=c++17")


def compile_cubin(source: str | Path, arch: int, include_dir: str | Path | None = None) -> tuple[bytes, str]:
    """Returns (cubin bytes, log). Raises RuntimeError with the compiler log on failure."""
    from cupy.cuda import compiler

    source = Path(source)
    inc = Path(include_dir) if include_dir else kernel_dir()
    opts = (f"-arch=sm_{arch}", *NVRTC_OPTIONS, f"-I{inc}")
    prog = compiler._NVRTCProgram(source.read_text(), source.name, method="cubin")
    try:
        cubin, _ = prog.compile(opts)
    except compiler.CompileException as e:
        raise RuntimeError(f"NVRTC failed for {source.name} sm_{arch}:\n{e}") from None
    return cubin, "ok"
