"""Launch table: plan op -> CUDA C kernel, grid, block and argument list.

Shared by the CUDA backend (CuPy arrays) and the CPU shim used in tests (NumPy arrays), so the
tests exercise exactly the launches a GPU gets. Argument lists, dtypes and size checks come from the
kernel specs (kernel_spec.py), geometry included: CUDA kernels trust what they are given.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.kernel_spec import SPECS


@dataclass(frozen=True)
class Launch:
    source: str  # kernels/<source>
    function: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple  # arrays and NumPy scalars


def launches(kernel: str, *arrays, **consts) -> tuple[Launch, ...]:
    """The CUDA launches of one op over its arrays (in spec order), checked against the spec."""
    spec = SPECS[kernel]
    sym = spec.bind(arrays, consts)
    named = dict(zip(spec.params, arrays))
    out = []
    for fn in spec.cuda:
        grid, block = fn.geometry(sym)
        out.append(Launch(fn.source, fn.name, grid, block, spec.cuda_args(fn, named, sym)))
    return tuple(out)


def _launcher(kernel: str):
    """launch(*buffers, *constants) with the twin's call shape: positional or by name."""
    spec = SPECS[kernel]
    names = spec.params + tuple(c for c, _ in spec.consts)

    def launch(*args, **kw):
        kw.update(zip(names, args))
        missing = [n for n in names if n not in kw]
        if missing or len(kw) != len(names):
            raise TypeError(f"{kernel}: expected {names}, missing {missing}, got {sorted(kw)}")
        return launches(kernel, *(kw[p] for p in spec.params), **{c: kw[c] for c, _ in spec.consts})
    launch.__name__ = kernel
    return launch


class _Launchers(dict):
    """The launcher of every kernel spec; one registered after import (a test's mixer) is made when asked for."""

    def __missing__(self, kernel: str):
        if kernel not in SPECS:
            raise KeyError(kernel)
        return _launcher(kernel)


LAUNCHERS = _Launchers({name: _launcher(name) for name in SPECS})


def gru_scan(gi, w_hh, b_hh, hs) -> Launch:
    """Cold prefill's whole-sequence GRU (not a plan op)."""
    return launches("gru_scan", gi, w_hh, b_hh, hs)[0]


def op_views(op, arena, start: int, count: int) -> list:
    """The op's buffers, row-sliced to [start, start + count) (weights whole)."""
    out = []
    for a in op.args:
        v = arena[a]
        out.append(v[start:start + count] if arena.placements[a].spec.per_row else v)
    return out


def op_launches(op, arena, start: int, count: int) -> tuple[Launch, ...]:
    return tuple(LAUNCHERS[op.kernel](*op_views(op, arena, start, count), **op.const_dict()))


def launches_for(plan, arena, start: int, count: int) -> list[Launch]:
    return [la for op in plan.ops for la in op_launches(op, arena, start, count)]


def kernel_dir() -> Path:
    """kernels/ of the source tree, or share/flashrt_ros/kernels of an install."""
    here = Path(__file__).resolve()
    candidates = [here.parents[3] / "kernels"]
    try:
        from ament_index_python.packages import get_package_share_directory
        candidates.append(Path(get_package_share_directory("flashrt_ros")) / "kernels")
    except Exception:  # noqa: BLE001 - not installed through ament; the source tree is enough
        pass
    for c in candidates:
        if (c / "common.cuh").exists():
            return c
    raise FileNotFoundError(f"CUDA kernel sources not found in {[str(c) for c in candidates]}")
