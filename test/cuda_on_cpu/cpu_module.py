"""CpuRawModule: compile a kernels/*.cu file with g++ and cpu_shim.h, then call its kernels with the
call shape of cupy.RawKernel: ``kernel(grid, block, args)``.

Arrays are NumPy arrays passed by data pointer (strided views are fine: the kernels take explicit row
strides). Scalars must be NumPy scalars whose size matches the C parameter, which is stricter than
CuPy (a Python int there silently becomes 8 bytes).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
from pathlib import Path

import numpy as np

from flashrt_ros.runtime.model.kernel_spec import cuda_defines

HERE = Path(__file__).resolve().parent
SHIM = HERE / "cpu_shim.h"
CACHE = HERE.parents[1] / "build" / "cuda_on_cpu"
_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)\s*\(')
_ERRORS = {1: "barrier deadlock", 2: "shuffle from an absent or exited lane", 3: "divergent __syncthreads"}


class ShimError(RuntimeError):
    pass


class CpuRawKernel:
    def __init__(self, lib, name: str):
        self.name = name
        self._launch = getattr(lib, f"cpu_launch__{name}")
        self._launch.restype = ctypes.c_int
        self._launch.argtypes = [ctypes.POINTER(ctypes.c_uint)] * 2 + [ctypes.POINTER(ctypes.c_void_p)]
        nargs = getattr(lib, f"cpu_nargs__{name}")
        nargs.restype = ctypes.c_int
        sizes = getattr(lib, f"cpu_argsizes__{name}")
        sizes.restype = ctypes.POINTER(ctypes.c_int)
        self.nargs = nargs()
        self.arg_sizes = [sizes()[i] for i in range(self.nargs)]

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        if len(args) != self.nargs:
            raise TypeError(f"{self.name}: expected {self.nargs} args, got {len(args)}")
        keep, ptrs = [], (ctypes.c_void_p * self.nargs)()
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                if self.arg_sizes[i] != ctypes.sizeof(ctypes.c_void_p):
                    raise TypeError(f"{self.name}: arg {i} is an array but the parameter is {self.arg_sizes[i]} B")
                holder = ctypes.c_void_p(a.__array_interface__["data"][0])
            elif isinstance(a, np.generic):
                if a.nbytes != self.arg_sizes[i]:
                    raise TypeError(f"{self.name}: arg {i} is {a.dtype} ({a.nbytes} B) but the parameter "
                                    f"is {self.arg_sizes[i]} B")
                holder = ctypes.create_string_buffer(a.tobytes(), a.nbytes)
            else:
                raise TypeError(f"{self.name}: arg {i}: pass NumPy arrays or NumPy scalars, got {type(a).__name__}")
            keep.append(holder)
            ptrs[i] = ctypes.cast(ctypes.pointer(holder), ctypes.c_void_p)
        rc = self._launch((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), ptrs)
        if rc:
            raise ShimError(f"{self.name}: CPU shim error {rc}: {_ERRORS.get(rc, 'unknown')}")


class CpuRawModule:
    def __init__(self, path: str | os.PathLike, include_dirs=(), cxx: str = "g++",
                 extra_flags=("-O2", "-U_FORTIFY_SOURCE"),  # fortified longjmp rejects fiber stacks
                 defines: tuple[str, ...] | None = None):  # None: the runtime's shared constants
        path = Path(path).resolve()
        src = path.read_text()
        self.names = _KERNEL_RE.findall(src)
        wrapper = [f'#include "{path}"']
        for n in self.names:
            wrapper.append(
                f'extern "C" int cpu_launch__{n}(const unsigned* g, const unsigned* b, void** a)'
                f'{{ return cushim::launch({n}, dim3(g[0],g[1],g[2]), dim3(b[0],b[1],b[2]), a); }}\n'
                f'extern "C" int cpu_nargs__{n}() {{ return cushim::nargs({n}); }}\n'
                f'extern "C" const int* cpu_argsizes__{n}() {{ return cushim::arg_sizes({n}); }}')
        wsrc = "\n".join(wrapper) + "\n"
        flags = [cxx, "-std=c++17", "-shared", "-fPIC", *extra_flags, *(cuda_defines() if defines is None else defines),
                 "-include", str(SHIM), "-I", str(path.parent)]
        for d in include_dirs:
            flags += ["-I", str(d)]
        headers = "".join(p.read_text() for p in sorted(path.parent.glob("*.cuh")))
        key = hashlib.sha256((wsrc + src + headers + SHIM.read_text() + " ".join(flags)).encode()).hexdigest()[:16]
        CACHE.mkdir(parents=True, exist_ok=True)
        so = CACHE / f"{path.stem}.{key}.so"
        if not so.exists():
            cpp = so.with_suffix(".cpp")
            cpp.write_text(wsrc)
            tmp = so.with_suffix(f".{os.getpid()}.tmp")
            res = subprocess.run(flags + ["-x", "c++", str(cpp), "-o", str(tmp)], capture_output=True, text=True)
            if res.returncode:
                raise ShimError(f"g++ failed for {path.name}:\n{res.stderr}")
            os.replace(tmp, so)
        self._lib = ctypes.CDLL(str(so))

    def get_function(self, name: str) -> CpuRawKernel:
        if name not in self.names:
            raise AttributeError(f"no kernel {name!r}; the module has {self.names}")
        return CpuRawKernel(self._lib, name)
