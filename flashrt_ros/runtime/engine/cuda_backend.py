"""CupyBackend: the plan as CUDA C kernels (kernels/*.cu via RawModule), captured into CUDA graphs.

allocate (cupy.zeros, before any capture) -> warm up (eager launches) -> capture (one graph per row
range: the live step and the padded replan batch) -> replay (Graph.launch). Snapshot and restore are
memcpyAsync device-to-device copies of the slab on the same stream. Observation upload and action
download go through pinned host buffers.
"""
from __future__ import annotations

import numpy as np

from ..model.kernel_spec import cuda_defines
from .launch_table import kernel_dir, launches, launches_for

_D2D = 3  # cudaMemcpyDeviceToDevice


class CudaGraphReplay:
    def __init__(self, backend: CupyBackend, plan, arena, start: int, count: int):
        self.backend = backend
        self.launches = launches_for(plan, arena, start, count)
        self.calls = [(backend.function(la.source, la.function), la) for la in self.launches]
        cp, s = backend.xp, backend.stream
        rows = arena.state[start:start + count]
        with s:
            saved = cp.empty_like(rows)  # bind time only: warm-up must leave the rows as they were
        backend.copy(saved, rows)
        self.replay_eager()  # loads every module and checks every launch before capture
        backend.copy(rows, saved)
        s.synchronize()
        with s:
            s.begin_capture()
            try:
                for fn, la in self.calls:
                    fn(la.grid, la.block, la.args)
            finally:
                self.graph = s.end_capture()
        if hasattr(self.graph, "upload"):  # pre-instantiate so the first replay is not slower
            self.graph.upload(s)
        s.synchronize()

    def replay_eager(self) -> None:
        with self.backend.stream:
            for fn, la in self.calls:
                fn(la.grid, la.block, la.args)

    def replay(self) -> None:
        self.graph.launch(self.backend.stream)


class CupyBackend:
    name = "cuda"
    fixed_batch = True  # graphs have fixed shapes: replan pads to max_branches rows
    concurrent_replay = False  # one stream, bound graphs: a replan's batched step computes under the lock

    def __init__(self):
        import cupy
        import cupyx

        self.xp = cupy
        self._cupyx = cupyx
        self.stream = cupy.cuda.Stream(non_blocking=True)  # capture is impossible on the default stream
        self._modules: dict[str, object] = {}
        self._pinned: dict[tuple, np.ndarray] = {}
        self._kdir = kernel_dir()

    # ---- memory ---------------------------------------------------------------------------
    def activate(self):
        return self.stream

    def zeros(self, shape, dtype):
        with self.stream:
            a = self.xp.zeros(shape, dtype)
        self.stream.synchronize()
        return a

    def view(self, base, offset: int, shape, dtype, strides):
        return self.xp.ndarray(shape, dtype, memptr=base.data + offset, strides=strides)

    def copy(self, dst, src) -> None:
        """One async device-to-device copy on the runtime stream (snapshot, restore, branch fork)."""
        if dst.nbytes != src.nbytes or not (dst.flags.c_contiguous and src.flags.c_contiguous):
            raise ValueError(f"copy: contiguous buffers of equal size required ({dst.nbytes} vs {src.nbytes} B)")
        self.xp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, _D2D, self.stream.ptr)

    def _pin(self, shape, dtype) -> np.ndarray:
        key = (tuple(shape), np.dtype(dtype).str)
        buf = self._pinned.get(key)
        if buf is None:
            buf = self._pinned[key] = self._cupyx.empty_pinned(shape, dtype)
        return buf

    def to_host(self, arr) -> np.ndarray:
        if not arr.flags.c_contiguous:
            with self.stream:
                arr = self.xp.ascontiguousarray(arr)
        pinned = self._pin(arr.shape, arr.dtype)
        arr.get(stream=self.stream, out=pinned)  # blocking: waits for the stream
        return pinned.copy()

    def from_host(self, dst, src) -> None:
        src = np.ascontiguousarray(src, dtype=dst.dtype).reshape(dst.shape)
        pinned = self._pin(src.shape, src.dtype)
        pinned[...] = src
        if dst.flags.c_contiguous:
            dst.set(pinned, stream=self.stream)
        else:
            with self.stream:
                dst[...] = self.xp.asarray(pinned)
        self.stream.synchronize()  # the pinned buffer is reused by the next upload

    def sync(self) -> None:
        self.stream.synchronize()

    # ---- kernels --------------------------------------------------------------------------
    def function(self, source: str, name: str):
        mod = self._modules.get(source)
        if mod is None:
            code = (self._kdir / source).read_text()
            mod = self._modules[source] = self.xp.RawModule(code=code, options=("-std=c++17", f"-I{self._kdir}",
                                                                                  *cuda_defines()))
        return mod.get_function(name)

    def bind(self, plan, arena, start: int, count: int) -> CudaGraphReplay:
        return CudaGraphReplay(self, plan, arena, start, count)

    def launch(self, kernel: str, *arrays, **consts) -> None:
        """One kernel of the spec table, eagerly on the runtime stream (cold prefill's sequence kernels, such
        as the GRU scan: sequence.py)."""
        with self.stream:
            for la in launches(kernel, *arrays, **consts):
                self.function(la.source, la.function)(la.grid, la.block, la.args)
