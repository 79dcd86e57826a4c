"""Backends: where buffers live and how a bound plan replays.

``NumpyBackend`` is the reference. ``CpuBackend`` (cpu_backend.py) runs the same plan
compiled, one nogil call per step. ``CupyBackend`` (cuda_backend.py) runs it as CUDA C kernels captured into
CUDA graphs. ``select("auto" | "numpy" | "cpu" | "cuda")``.
"""
from __future__ import annotations

import contextlib
import logging
import platform

import numpy as np

from ..model.plan import GraphPlan, NumpyReplay

log = logging.getLogger("flashrt_ros.runtime")


class NumpyBackend:
    name = "numpy"
    xp = np
    # Replaying rows 1..b while another thread replays row 0 is safe: every row's buffers are its own, the
    # log pages a row writes are its own, and nothing is queued behind another call (replan.py). The CUDA
    # backend has one stream and bound graphs: without this attribute a replan computes under the lock.
    concurrent_replay = True

    def activate(self):
        """Context in which array-module ops run in order with the backend's own (nothing for NumPy)."""
        return contextlib.nullcontext()

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype)

    def view(self, base: np.ndarray, offset: int, shape, dtype, strides):
        return np.ndarray(shape, dtype, buffer=base, offset=offset, strides=strides)

    def copy(self, dst, src) -> None:
        np.copyto(dst, src)

    def to_host(self, arr) -> np.ndarray:
        return np.array(arr, copy=True)

    def from_host(self, dst, src: np.ndarray) -> None:
        dst[...] = src

    def bind(self, plan: GraphPlan, arena, start: int, count: int) -> NumpyReplay:
        return NumpyReplay(plan, arena, start, count)

    def sync(self) -> None:
        pass


class BackendUnavailable(RuntimeError):
    pass


def cuda_probe() -> str | None:
    """None when CuPy has a usable device (a tiny allocation and a kernel compile succeed), else why not."""
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - any import failure means no CUDA
        return f"cupy is not importable ({type(e).__name__}: {e})"
    try:
        if not cupy.is_available():
            return "cupy finds no CUDA device"
        a = cupy.zeros(4, cupy.float32)
        k = cupy.RawKernel(r'extern "C" __global__ void probe(float* a){ a[threadIdx.x] = 1.f; }', "probe")
        k((1,), (4,), (a,))
        cupy.cuda.Stream.null.synchronize()
        if float(a.sum()) != 4.0:
            return "probe kernel produced a wrong result"
    except Exception as e:  # noqa: BLE001
        return f"CUDA probe failed ({type(e).__name__}: {e})"
    return None


BACKENDS = ("auto", "numpy", "cpu", "cuda")


def _compiled_cpu_features() -> str:
    """The target features numba compiles for here ("+fma,+avx,..."): the host's, or NUMBA_CPU_FEATURES, with
    AVX off under NUMBA_ENABLE_AVX=0; empty for a named CPU such as NUMBA_CPU_NAME=generic."""
    from numba.core.registry import cpu_target
    return getattr(cpu_target.target_context.codegen(), "_tm_features", None) or ""


def cpu_lacks_fma() -> bool:
    """Whether the compiled step's fused multiply-adds (cpu_simd.py) become one libm call per lane: numba compiles
    for an x86-64 target without FMA3 (which needs AVX). aarch64 always has FMA."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        features = set(_compiled_cpu_features().split(","))
    except Exception:  # noqa: BLE001 - no feature list on this host: assume the common case
        return False
    return not {"+fma", "+avx"} <= features


_fma_warned = False


def cpu_backend():
    """The compiled CPU backend (cpu_backend.py); BackendUnavailable when numba is missing."""
    try:
        from .cpu_backend import CpuBackend
    except ImportError as e:
        raise BackendUnavailable(f"backend 'cpu' needs numba ({e}); install it (make setup does) or use "
                                 f"backend numpy") from e
    global _fma_warned
    if not _fma_warned and cpu_lacks_fma():
        _fma_warned = True
        log.warning("backend cpu: this CPU has no FMA unit, so the compiled step's fused multiply-adds run as "
                    "libm calls (the same bytes, several times slower); backend numpy may be faster here (see "
                    "NUMBA_CPU_NAME, NUMBA_ENABLE_AVX)")
    return CpuBackend()


def warm_cpu_step(name: str = "auto") -> float | None:
    """When backend ``name`` resolves to the compiled CPU one, compile its step in this process (or read it from
    numba's on-disk cache) and return the seconds that took; None for NumPy, CUDA, or without numba. A node
    started afterwards reads the cache in about a second, instead of compiling for tens of seconds inside its
    configure while the processes around it wait (a first `make demo`'s planner gave up after 30 s)."""
    if name not in ("auto", "cpu") or (name == "auto" and cuda_probe() is None):
        return None
    try:
        from .cpu_backend import _kernels, compile_seconds
    except ImportError:  # numba missing: auto falls back to NumPy, cpu fails with its own message
        return None
    _kernels()
    return compile_seconds()


def select(name: str = "auto"):
    """'numpy', 'cpu' (compiled, numba), 'cuda', or 'auto' (CUDA when usable, else the compiled CPU backend,
    else NumPy). Logs the choice and, for auto, why a faster backend was passed over."""
    if name not in BACKENDS:
        raise ValueError(f"backend: expected auto, numpy, cpu or cuda, got {name!r}")
    if name == "numpy":
        return NumpyBackend()
    if name == "cpu":
        log.info("backend: cpu (requested)")
        return cpu_backend()
    why_not = cuda_probe()
    if why_not is None:
        from .cuda_backend import CupyBackend
        log.info("backend: cuda (%s)", "auto" if name == "auto" else "requested")
        return CupyBackend()
    if name == "cuda":
        raise BackendUnavailable(f"backend 'cuda' requested but unavailable: {why_not}")
    try:
        backend = cpu_backend()
    except Exception as e:  # noqa: BLE001 - numba missing or unable to compile here: the reference still runs
        log.warning("backend: numpy (auto; CUDA unavailable: %s; compiled CPU backend unavailable: %s)", why_not, e)
        return NumpyBackend()
    log.info("backend: cpu (auto; CUDA unavailable: %s)", why_not)
    return backend
