"""CpuBackend: the step plan compiled for the CPU (numba), one nogil call per step: the CPU's CUDA graph.

Memory is the NumPy backend's (the same arena, KV log, capsules, files). Binding a plan to a row range
encodes it once as an integer program (kernel code, then per buffer: region, element offset, row stride,
size; then the op's dimensions); replay is one call of the run_program generated from the compiled kernels'
registry (cpu_registry.py) over the arena's flat regions, which writes in place and allocates nothing. The
weight region is the arena's weight slab plus its GEMV matrices in column panels (cpu_panels.py), built once
per arena. Cold prefill is the NumPy backend's tuned BLAS prefill, the fastest cold path on this CPU.

The first use compiles (tens of seconds); numba caches the machine code on disk, in a folder keyed by the
compiled sources (numba_cache.py), so later starts load it in about a second.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from math import prod

import numpy as np

from .backend import NumpyBackend

log = logging.getLogger("flashrt_ros.runtime")

_compiled = threading.Lock()
_compile_s: float | None = None  # seconds the first load (compile or cache read) took in this process


def _kernels():
    """cpu_kernels, compiled or loaded from the cache on first use (once per process), timed."""
    global _compile_s
    with _compiled:
        from . import cpu_kernels as ck
        if _compile_s is None:
            t0 = time.perf_counter()
            _warm_up(ck.run_program)
            _compile_s = time.perf_counter() - t0
            cached = sum(ck.run_program.stats.cache_hits.values()) > 0
            log.info("backend cpu: compiled step ready in %.1f s (%s)", _compile_s,
                     "read from the on-disk cache" if cached else
                     "compiled on this first start; later starts read the on-disk cache")
        return ck


def _warm_up(run_program) -> None:
    """One call on an empty program: compiles (or loads) run_program for the arena's argument types."""
    from . import cpu_program as cp
    f = np.zeros(1, np.float32)
    run_program(np.zeros((0, cp.DIM0 + cp.N_DIMS), np.int64), np.zeros(0), f, np.zeros(1, np.int64), f, f, f, 0)


def _program():
    """The compiled program of the registry as it is now (the built-in one, or one with a kernel added)."""
    ck = _kernels()
    from .cpu_registry import program
    built = program()
    if built.run is not ck.run_program and not built.run.signatures:
        _warm_up(built.run)  # at bind, not in the first step
    return built


def compile_seconds() -> float | None:
    return _compile_s


class CompiledReplay:
    """A plan bound to rows [start, start + count) of the arena: one encoded program, one call per replay."""

    def __init__(self, plan, arena, start: int, count: int):
        program = _program()
        from . import cpu_program as cp
        self._run = program.run
        codes = program.codes
        self.rows = count
        self._regions = (arena.state.reshape(-1).view(np.float32), arena.state.reshape(-1).view(np.int64),
                         arena.work.view(np.float32), arena.weight_slab.view(np.float32),
                         arena.log_slab.view(np.float32))
        bases = {cp.REG_STATE: arena.state, cp.REG_WORK: arena.work, cp.REG_WEIGHT: arena.weight_slab,
                 cp.REG_LOG: arena.log_slab}
        self.prog = np.zeros((len(plan.ops), cp.DIM0 + cp.N_DIMS), np.int64)
        self.fconst = np.zeros(len(plan.ops), np.float64)
        for o, op in enumerate(plan.ops):
            views = [arena[a][start:start + count] if arena.placements[a].spec.per_row else arena[a]
                     for a in op.args]
            sym = op.spec.spec.bind(views, op.const_dict(), contiguity=False)  # the twin's shape checks, once
            if len(op.args) > cp.MAX_ARGS:
                raise ValueError(f"backend cpu: {op.kernel} takes {len(op.args)} buffers, the program holds "
                                 f"{cp.MAX_ARGS}; raise cpu_program.MAX_ARGS")
            self.prog[o, 0] = codes[op.kernel]
            for i, a in enumerate(op.args):
                spec = arena.placements[a].spec
                region = (cp.REG_STATE if spec.is_state else cp.REG_LOG if spec.role == "kv"
                          else cp.REG_WEIGHT if spec.role == "weight" else cp.REG_WORK)
                item = np.dtype(spec.dtype).itemsize
                arr = arena[a]
                off = (arr.ctypes.data - bases[region].ctypes.data) // item
                stride = arr.strides[0] // item if spec.per_row else 0
                self.prog[o, 1 + cp.ARG_COLS * i:1 + cp.ARG_COLS * (i + 1)] = (
                    cp.REG_STATE_I64 if spec.dtype == "int64" else region, off + start * stride, stride,
                    prod(spec.shape))
            if op.kernel == "attn_decode":  # its kernel indexes q and its scratch in the work slab directly
                assert all(self.prog[o, 1 + cp.ARG_COLS * i] == cp.REG_WORK for i in (0, 5, 6, 7, 8, 9))
            dims, self.fconst[o] = program.kernels[codes[op.kernel]].encode(sym)
            self.prog[o, cp.DIM0:cp.DIM0 + len(dims)] = dims
        self._regions = self._regions[:3] + (self._use_panels(plan, arena),) + self._regions[4:]

    def _use_panels(self, plan, arena) -> np.ndarray:
        """Points every GEMV matrix argument at its column-panel copy (cpu_panels.py); returns the weight region
        that holds both layouts."""
        from . import cpu_program as cp
        from .cpu_panels import GEMV_MATRICES, panel_shape, weight_region
        uses = []  # (op, argument, (offset, n_in, n_out))
        for o, op in enumerate(plan.ops):
            for a in GEMV_MATRICES.get(op.kernel, ()):
                col = 1 + cp.ARG_COLS * a
                assert self.prog[o, col] == cp.REG_WEIGHT, f"{op.kernel}: argument {a} is not a weight"
                n_in, n_out = panel_shape(op.kernel, a, [int(v) for v in self.prog[o, cp.DIM0:]])
                assert self.prog[o, col + 3] == n_in * n_out, f"{op.kernel}: weight {a} is not {n_in} x {n_out}"
                uses.append((o, col, (int(self.prog[o, col + 1]), n_in, n_out)))
        region, at = weight_region(arena, frozenset(key for _, _, key in uses))
        for o, col, key in uses:
            offset, half = at[key]
            self.prog[o, col:col + 2] = cp.REG_PANEL16 if half else cp.REG_PANEL, offset
        return region

    def replay(self) -> None:
        self._run(self.prog, self.fconst, *self._regions, self.rows)


class SplitReplay:
    """Rows [start, start + count) as contiguous parts, one per thread, replayed at the same time: the compiled
    step releases the GIL, and each row computes the same bytes in any part (no reduction crosses rows). The
    other parts run at the calling thread's nice value (replan_nice)."""

    def __init__(self, parts: list[CompiledReplay]):
        self.parts = parts
        self.rows = sum(p.rows for p in parts)

    def replay(self) -> None:
        nice = _nice()
        pending = []
        try:
            pool = _pool(len(self.parts) - 1)
            pending = [pool.submit(_replay_at_nice, p, nice) for p in self.parts[1:]]
            self.parts[0].replay()
        finally:
            wait(pending)  # every part has ended before this returns, whichever raised: the rows are free then
        for f in pending:
            f.result()  # a part's error, raised here


def _nice() -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):  # not Linux: nothing to follow
        return 0


def _replay_at_nice(part: CompiledReplay, nice: int) -> None:
    """A part on a pool thread at the caller's nice value (a pool thread serves every later replan, whose
    caller's may differ); one that may not be lowered stays as it is."""
    if _nice() != nice:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except (AttributeError, OSError):
            pass
    part.replay()


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """One pool per size for the process, shared by every session's replays (each holds its own rows; two
    sessions replanning at once queue their parts, never deadlock: each caller runs its first part itself)."""
    with _pools_lock:
        if workers not in _pools:
            _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="flashrt-replan")
        return _pools[workers]


def row_parts(count: int, threads: int) -> list[tuple[int, int]]:
    """(first row, rows) of each part: count rows in min(threads, count) parts, the first ones a row longer."""
    n = max(1, min(threads, count))
    sizes = [count // n + (1 if i < count % n else 0) for i in range(n)]
    return [(sum(sizes[:i]), k) for i, k in enumerate(sizes)]


class CpuBackend(NumpyBackend):
    name = "cpu"
    splits_rows = True  # bind(..., threads=N) splits a batch's rows over N threads

    def __init__(self):
        _kernels()  # compile (or load the cache) at construction, not in the first step

    def bind(self, plan, arena, start: int, count: int, threads: int = 1) -> CompiledReplay | SplitReplay:
        from .cpu_registry import COMPILED
        unknown = sorted({op.kernel for op in plan.ops} - set(COMPILED))
        if unknown:
            raise ValueError(f"backend cpu: no compiled kernel for {unknown}; use backend numpy for this model")
        if threads < 1:
            raise ValueError(f"replan_threads: must be >= 1, got {threads}")
        parts = row_parts(count, threads)
        if len(parts) == 1:
            return CompiledReplay(plan, arena, start, count)
        return SplitReplay([CompiledReplay(plan, arena, start + first, rows) for first, rows in parts])
