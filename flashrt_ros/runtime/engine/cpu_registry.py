"""The compiled CPU kernels, one entry per kernel spec, and the step program generated from them.

A numba kernel registers with ``@compiled``; its name is its spec's (model/kernel_spec.py), whose NumPy twin
(model/kernels.py) it must compute. Its parameter names say what the program passes it:

  a buffer of the spec              that buffer at one row; the kernel then runs once per row of the range
  op sf si wf gf lf rows (leading)  the encoded op and the flat regions (cpu_program.py), once for all rows:
                                    kernels that share loads across rows (attention, the GEMVs)
  anything else                     a symbol of the spec (a dimension or a constant, bound when the plan is
                                    bound): an f32 constant as the op's float, any other as an integer dim

``run_program`` is generated from the registry (one branch per kernel, calling it directly so the compiler
inlines it), written into the numba cache directory and compiled there, so it is cached like the kernels. A
registry with another kernel (a mixer in a test) gets a program of its own.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..model.kernel_spec import CUDA_CONSTANTS, KernelSpec
from ..model.kernels import REGISTRY, Kernel
from . import numba_cache
from .cpu_program import DIM0, MAX_ARGS, N_DIMS, _f, _i

REGIONS = ("op", "sf", "si", "wf", "gf", "lf", "rows")


@dataclass(frozen=True)
class CompiledKernel:
    """One plan kernel whole: its spec and NumPy twin (``kernel``) and its numba form."""
    kernel: Kernel
    fn: object  # the numba dispatcher
    params: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def spec(self) -> KernelSpec:
        return self.kernel.spec

    @property
    def per_row(self) -> bool:
        return self.params[:1] != ("op",)

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if p not in self.spec.params and p not in REGIONS
                     and p != self.fconst)

    @property
    def fconst(self) -> str | None:
        return next((c for c, t in self.spec.consts if t == "f32" and c in self.params), None)

    def encode(self, sym: dict) -> tuple[list[int], float]:
        """The op's integer dims and float constant, from the symbols its spec bound."""
        return [int(sym[s]) for s in self.dims], float(sym[self.fconst]) if self.fconst else 0.0

    def call(self, code: int) -> str:
        """The kernel's call in run_program (op = prog[o], dims = its dims, b = the row)."""
        dims = iter(range(N_DIMS))
        args = []
        for p in self.params:
            if p in REGIONS:
                args.append(p)
            elif p in self.spec.params:
                i = self.spec.params.index(p)
                args.append(f"_i(si, op, {i}, b)" if self.spec.buf(p).dtype == "i64" else
                            f"_f(sf, wf, gf, lf, op, {i}, b)")
            elif p == self.fconst:
                args.append("fconst[o]")
            else:
                args.append(f"dims[{next(dims)}]")
        call = f"k{code}({', '.join(args)})"
        return f"for b in range(rows):\n                {call}" if self.per_row else call


COMPILED: dict[str, CompiledKernel] = {}


def compiled(fn):
    """Register numba kernel fn as the compiled form of the plan kernel of its name."""
    name = fn.py_func.__name__
    if name not in REGISTRY:
        raise TypeError(f"compiled kernel {name}: no plan kernel of that name (a spec and its NumPy twin)")
    entry = CompiledKernel(REGISTRY[name], fn, tuple(inspect.signature(fn.py_func).parameters))
    spec, params = entry.spec, entry.params
    symbols = _symbols(spec)
    unknown = [p for p in entry.dims if p not in symbols]
    if unknown:
        raise TypeError(f"compiled kernel {name}: {unknown} are neither buffers nor symbols of its spec "
                        f"{sorted(symbols)}")
    if entry.per_row and any(p in REGIONS for p in params):
        raise TypeError(f"compiled kernel {name}: the regions {REGIONS} come first, after op, or not at all")
    if len(entry.dims) > N_DIMS or len(spec.params) > MAX_ARGS:
        raise TypeError(f"compiled kernel {name}: the program holds {N_DIMS} dims and {MAX_ARGS} buffers per op")
    COMPILED[name] = entry
    return fn


def _symbols(spec: KernelSpec) -> set[str]:
    names = {t for b in spec.bufs for d in b.dims for t in re.findall(r"[A-Za-z_]\w*", d)}
    return (names - set(CUDA_CONSTANTS)) | {c for c, _ in spec.consts} | {s for s, _ in spec.derive}


@dataclass(frozen=True)
class Program:
    run: object  # run_program(prog, fconst, sf, si, wf, gf, lf, rows)
    kernels: tuple[CompiledKernel, ...]  # the kernel of code c is kernels[c]

    @property
    def codes(self) -> dict[str, int]:
        return {k.name: c for c, k in enumerate(self.kernels)}


_TEMPLATE = '''"""run_program over {names}: generated by flashrt_ros/runtime/engine/cpu_registry.py."""
from numba import njit


@njit(cache=True, nogil=True)
def run_program(prog, fconst, sf, si, wf, gf, lf, rows):
    for o in range(prog.shape[0]):
        op = prog[o]
        k = op[0]
        dims = op[DIM0:DIM0 + N_DIMS]
{branches}
'''


def program_source(kernels: tuple[CompiledKernel, ...]) -> str:
    branches = "\n".join(f"        {'if' if c == 0 else 'elif'} k == {c}:\n            {k.call(c)}"
                         for c, k in enumerate(kernels))
    return _TEMPLATE.format(names=", ".join(k.name for k in kernels), branches=branches)


_programs: dict[tuple, Program] = {}


def program() -> Program:
    """The program of every registered kernel, built once per registry."""
    from . import cpu_attention, cpu_kernels, cpu_linear  # noqa: F401  the built-in kernels register
    kernels = tuple(COMPILED.values())
    key = tuple((k.name, k.fn) for k in kernels)
    if key not in _programs:
        _programs[key] = Program(_load(kernels), kernels)
    return _programs[key]


def _load(kernels: tuple[CompiledKernel, ...]):
    """Writes the program's source where numba caches (named by its hash and that of every kernel's module
    outside the cache key, so an edit there compiles afresh), imports it with the kernels in its globals."""
    source = program_source(kernels)
    h = hashlib.sha256(source.encode())
    keyed = set(numba_cache.SOURCES)
    for k in kernels:
        path = Path(inspect.getsourcefile(k.fn.py_func)).resolve()
        if path not in keyed:
            h.update(path.read_bytes())
    name = f"run_program_{h.hexdigest()[:16]}"
    path = Path(numba_cache.CACHE_DIR) / "programs" / f"{name}.py"
    if not path.exists() or path.read_text() != source:  # the cache directory is checked (numba_cache.py)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # whole, whoever else writes it at the same time
    spec = importlib.util.spec_from_file_location(f"flashrt_ros_{name}", path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(DIM0=DIM0, N_DIMS=N_DIMS, _f=_f, _i=_i, **{f"k{c}": k.fn for c, k in enumerate(kernels)})
    sys.modules[spec.name] = module  # numba finds a cached function's globals through its module's name
    spec.loader.exec_module(module)
    return module.run_program
