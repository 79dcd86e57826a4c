"""A whole-plan backend for tests: NumPy memory, every op launched as its CUDA C kernel on the CPU.

It binds the plan through the same launch table the CUDA backend uses (flashrt_ros.runtime.engine.launch_table),
so a 200-step run here exercises every kernel, argument and row stride a GPU would see.
"""
from __future__ import annotations

from functools import cache

from cuda_on_cpu.cpu_module import CpuRawModule
from flashrt_ros.runtime.engine.backend import NumpyBackend
from flashrt_ros.runtime.engine.launch_table import kernel_dir, launches, launches_for


@cache
def module(source: str) -> CpuRawModule:
    return CpuRawModule(kernel_dir() / source)


class ShimReplay:
    def __init__(self, plan, arena, start: int, count: int):
        self.launches = launches_for(plan, arena, start, count)
        self.calls = [(module(la.source).get_function(la.function), la) for la in self.launches]

    def replay(self) -> None:
        for fn, la in self.calls:
            fn(la.grid, la.block, la.args)


class ShimBackend(NumpyBackend):
    name = "shim"
    concurrent_replay = False  # the CUDA kernels through the shim: a replan computes under the lock, as on CUDA

    def bind(self, plan, arena, start: int, count: int) -> ShimReplay:
        return ShimReplay(plan, arena, start, count)

    def launch(self, kernel: str, *arrays, **consts) -> None:
        """As the CUDA backend: cold prefill's sequence kernels (the GRU scan) run as their .cu code."""
        for la in launches(kernel, *arrays, **consts):
            module(la.source).get_function(la.function)(la.grid, la.block, la.args)
