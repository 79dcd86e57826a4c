"""The weight region the compiled CPU step reads: the arena's weight slab, then every GEMV matrix of the plan
again in column panels (panel p holds columns 8p..8p+7 of every input row, n_in x 8 floats in address order;
the last panel zero-padded). A block of output columns then reads whole cache lines in order instead of one
line per input row at a stride of n_out (cpu_linear.py says what that cost). Built once per arena and shared
by every row range bound to it; weights never change after a Session is built, so the copy cannot go stale.
A matrix whose every weight is a bf16 value is held at 16 bits (its float32's upper half: exact), any other at
32, so a loaded policy is never rounded.
"""
from __future__ import annotations

import logging
from weakref import WeakKeyDictionary

import numpy as np

from .cpu_program import PANEL

log = logging.getLogger("flashrt_ros.runtime")

_ALIGN = 16  # floats: each panel matrix starts on a 64-byte cache line
GEMV_MATRICES = {"linear": (1,), "gru_cell": (2, 3)}  # kernel -> its arguments that are GEMV matrices

_built: WeakKeyDictionary = WeakKeyDictionary()  # arena -> {matrices: (region, {(offset, n_in, n_out): at})}


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def panel_shape(kernel: str, arg: int, dims: list[int]) -> tuple[int, int]:
    """(n_in, n_out) of the GEMV matrix that argument `arg` of a `kernel` op holds, from its encoded dims."""
    if kernel == "linear":  # dims (n_in, n_out, act): w
        return dims[0], dims[1]
    return (dims[0] if arg == 2 else dims[1]), 3 * dims[1]  # gru_cell, dims (n_in, H): w_ih, w_hh, 3H gates


def to_panels(w: np.ndarray) -> np.ndarray:
    """(n_in, n_out) row-major -> panels, flat: out[(p n_in + i) 8 + e] = w[i, 8p + e], zero past n_out."""
    n_in, n_out = w.shape
    padded = np.zeros((n_in, _round_up(n_out, PANEL)), np.float32)
    padded[:, :n_out] = w
    return np.ascontiguousarray(padded.reshape(n_in, -1, PANEL).transpose(1, 0, 2)).reshape(-1)


def bf16_exact(w: np.ndarray) -> bool:
    """Every value of float32 w is a bf16 value: its low 16 bits are zero (so 16 bits hold it exactly)."""
    return not (np.ascontiguousarray(w, np.float32).view(np.uint32) & np.uint32(0xFFFF)).any()


def weight_region(arena, matrices: frozenset[tuple[int, int, int]]) -> tuple[np.ndarray, dict]:
    """The float32 weight region with `matrices` ((element offset, n_in, n_out) in the weight slab) appended as
    panels, and each matrix's (offset, 16-bit) there: a bf16-exact matrix's panels hold 16 bits per weight,
    its offset counted in 16-bit units; any other's 32, counted in floats. Cached per arena and matrix set."""
    per_arena = _built.setdefault(arena, {})
    if matrices not in per_arena:
        slab = arena.weight_slab.view(np.float32)
        at, end = {}, _round_up(slab.size, _ALIGN)
        half = {key: bf16_exact(slab[key[0]:key[0] + key[1] * key[2]]) for key in matrices}
        for key in sorted(matrices):
            _, n_in, n_out = key
            n = _round_up(n_out, PANEL) * n_in
            at[key] = (2 * end, True) if half[key] else (end, False)
            end += _round_up(-(-n // 2) if half[key] else n, _ALIGN)
        region = np.zeros(end, np.float32)
        region[:slab.size] = slab
        for (off, n_in, n_out), (dst, is_half) in at.items():
            panels = to_panels(slab[off:off + n_in * n_out].reshape(n_in, n_out))
            if is_half:
                region.view(np.uint16)[dst:dst + panels.size] = panels.view(np.uint32) >> np.uint32(16)
            else:
                region[dst:dst + panels.size] = panels
        per_arena[matrices] = (region, at)
        total = sum(4 * n_in * n_out for _, n_in, n_out in matrices)
        log.info("backend cpu: %d of %d weight matrices hold bf16 values, read at 16 bits: %.2f MiB a step "
                 "instead of %.2f", sum(half.values()), len(matrices), (total - bytes_saved(arena)) / 2**20,
                 total / 2**20)
    return per_arena[matrices]


def bytes_saved(arena) -> int:
    """Bytes a step does not read because matrices of this arena's weight region(s) are held at 16 bits (each
    matrix once, whichever bound plans hold it)."""
    half = {key for _, at in _built.get(arena, {}).values() for key, (_, is_half) in at.items() if is_half}
    return sum(2 * n_in * n_out for _, n_in, n_out in half)
