"""Launch table: plan op -> CUDA C kernel, grid, block and argument list.

Shared by the CUDA backend (CuPy arrays) and the CPU shim used in tests (NumPy arrays), so the
tests exercise exactly the launches a GPU gets. Argument lists, dtypes and size checks come from the
kernel specs (kernel_spec.py): CUDA kernels trust what they are given. Only the launch geometry is
written here, per CUDA function.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .kernel_spec import ATTN_THREADS, GRU_SCAN_MAX_H, SPECS


@dataclass(frozen=True)
class Launch:
    source: str  # kernels/<source>
    function: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple  # arrays and NumPy scalars


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _flat(n: int, threads: int = 128) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return (max(1, _cdiv(n, threads)), 1, 1), (threads, 1, 1)


def _gru_scan_geometry(s: dict):
    """S lanes per hidden unit: the largest power of two <= 32 with H * S <= GRU_SCAN_MAX_H threads."""
    S = 1
    while S < 32 and 2 * S * s["H"] <= GRU_SCAN_MAX_H:
        S *= 2
    s["S"] = S
    return (1, 1, 1), (_cdiv(s["H"] * S, 32) * 32, 1, 1)


# CUDA function -> (grid, block) from the op's symbols (it may add symbols the kernel takes, like S)
GEOMETRY = {
    "obs_norm_f32": lambda s: _flat(s["B"] * s["n"]),
    "linear_f32": lambda s: _flat(s["B"] * s["n_out"] * 32),  # a warp per output
    "add_f32": lambda s: _flat(s["B"] * s["n"]),
    "rmsnorm_f32": lambda s: ((s["B"], 1, 1), (32, 1, 1)),
    "causal_conv_f32": lambda s: _flat(s["B"] * s["d"]),
    "gru_cell_f32": lambda s: _flat(s["B"] * s["H"] * 32),  # a warp per hidden unit
    "gru_commit_f32": lambda s: _flat(s["B"] * s["H"]),
    "gru_scan_f32": _gru_scan_geometry,
    "kv_write_f32": lambda s: _flat(s["B"] * s["d"]),
    "attn_partial_f32": lambda s: ((s["B"] * s["n_heads"], s["P"], 1), (ATTN_THREADS, 1, 1)),
    "attn_combine_f32": lambda s: ((s["B"] * s["n_heads"], 1, 1), (max(32, _cdiv(s["hd"], 32) * 32), 1, 1)),
    "temporal_ensemble_f32": lambda s: ((s["B"], 1, 1), (64, 1, 1)),
    "rng_noise_f32": lambda s: _flat(s["B"] * s["A"], 64),
    "meta_advance_i64": lambda s: _flat(s["B"], 32),
}


def launches(kernel: str, *arrays, **consts) -> tuple[Launch, ...]:
    """The CUDA launches of one op over its arrays (in spec order), checked against the spec."""
    spec = SPECS[kernel]
    sym = spec.bind(arrays, consts)
    named = dict(zip(spec.params, arrays))
    out = []
    for fn in spec.cuda:
        grid, block = GEOMETRY[fn.name](sym)
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


LAUNCHERS = {name: _launcher(name) for name in SPECS if name != "gru_scan"}


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
    candidates = [here.parents[2] / "kernels"]
    try:
        from ament_index_python.packages import get_package_share_directory
        candidates.append(Path(get_package_share_directory("flashrt_ros")) / "kernels")
    except Exception:  # noqa: BLE001 - not installed through ament; the source tree is enough
        pass
    for c in candidates:
        if (c / "common.cuh").exists():
            return c
    raise FileNotFoundError(f"CUDA kernel sources not found in {[str(c) for c in candidates]}")
