"""The encoded plan the compiled CPU step runs (cpu_backend.py writes it, cpu_kernels.run_program reads it):
one int64 row per op, the kernel code, then per buffer argument its region, the element offset of the range's
first row, the row stride and the elements per row, then the op's dimensions. Helpers give an argument's row
as a slice of its flat region."""
from __future__ import annotations

from numba import njit

from . import numba_cache  # noqa: F401  before any @njit: the cache keyed by these sources

ARG_COLS = 4  # per argument: region, element offset of the first row, row stride, elements per row
MAX_ARGS = 15
DIM0 = 1 + ARG_COLS * MAX_ARGS  # first column of the op's integer dimensions
N_DIMS = 6
REG_STATE, REG_STATE_I64, REG_WORK, REG_WEIGHT, REG_LOG = range(5)
# a GEMV's matrix in the weight region as column panels (cpu_panels.py), read in address order
REG_PANEL = 5
REG_PANEL16 = 6  # the same panels of a bf16-exact matrix, 16 bits per weight (the upper half of its float32)
PANEL = 8  # columns per panel: one vector of float32 lanes (cpu_simd._LANES)


@njit(cache=True, nogil=True)
def _f(sf, wf, gf, lf, op, a, row):
    """Argument a of op, row `row` of the range: a float32 slice of its region."""
    c = 1 + ARG_COLS * a
    reg, off, n = op[c], op[c + 1] + row * op[c + 2], op[c + 3]
    if reg == REG_STATE:
        return sf[off:off + n]
    if reg == REG_WORK:
        return wf[off:off + n]
    if reg == REG_WEIGHT:
        return gf[off:off + n]
    return lf[off:off + n]


@njit(cache=True, nogil=True)
def _i(si, op, a, row):
    c = 1 + ARG_COLS * a
    off = op[c + 1] + row * op[c + 2]
    return si[off:off + op[c + 3]]


@njit(cache=True, nogil=True)
def _row(op, a, b):
    """Element offset of argument a at row b (in its region)."""
    return op[1 + ARG_COLS * a + 1] + b * op[1 + ARG_COLS * a + 2]
