"""The GEMVs of the compiled CPU step (cpu_kernels.py): ``linear`` and ``gru_cell`` over every row of a range.

y_r[j] = sum_i x_r[i] w[i, j], i in order, each (row, output) its own accumulator: the same float operations
for a row alone as for a row in a batch, so batching never changes a byte. Rows run in blocks of up to 4 that
share each weight load (a row alone reloaded the whole matrix per row), and a block's sums live in vector
registers across the whole input loop: the intrinsics of cpu_simd.py.

A matrix is row-major (REG_WEIGHT) or in column panels (REG_PANEL, cpu_panels.py): the bound step uses panels,
so a block walks its 8 to 64 columns in address order. Row-major, a 4-row block read one 64-byte line per
input row at a stride of n_out floats, and a step's weights (3.6 MiB at the default model) come from L3: on an
AVX2 EPYC that walk made a 4-row batched step 3-4x its warm-cache time. The layout changes which address a
weight is read from, never the order of any sum. A matrix whose every weight is a bf16 value (the seeded ones,
or a bf16-trained policy's) has 16-bit panels (REG_PANEL16): half the bytes, each weight widened exactly to the
float32 it is, so the same bytes again; a live step reads its 3.5 MiB of matrices from L3, so it is faster by
what it does not read."""
from __future__ import annotations

import numpy as np
from numba import njit

from ..model.kernel_spec import ACT_RELU, ACT_SILU, ACT_TANH
from . import numba_cache  # noqa: F401  before any @njit: the cache keyed by these sources
from .cpu_program import ARG_COLS, PANEL, REG_PANEL, REG_PANEL16, REG_STATE, REG_WEIGHT, REG_WORK, _row
from .cpu_registry import compiled
from .cpu_simd import (
    _LANES,
    _g1x1,
    _g1x2,
    _g1x4,
    _g1x8,
    _g2x1,
    _g2x2,
    _g2x4,
    _g3x1,
    _g3x2,
    _g4x1,
    _g4x2,
    fma32,
    weight_at,
)

_F0, _F1 = np.float32(0.0), np.float32(1.0)
_ROW_BLOCK = 4  # rows sharing one weight load


@njit(cache=True, nogil=True)
def _act(v, act):
    if act == ACT_SILU:
        return v / (_F1 + np.exp(-v))
    if act == ACT_TANH:
        return np.tanh(v)
    if act == ACT_RELU:
        return max(v, _F0)
    return v


@njit(cache=True, nogil=True)
def _gemv_block(xr, wr, yr, x_at, x_rs, w_at, n_in, w_rs, w_vs, y_at, y_rs, rows, j, wide):
    """Outputs j.. of a block of `rows` (1 to 4) rows, as many vectors as fit; returns the next output index."""
    wa, ya = w_at + j // _LANES * w_vs, y_at + j
    vecs = (wide - j) // _LANES
    if rows == 4:
        if vecs >= 2:
            _g4x2(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
            return j + 2 * _LANES
        _g4x1(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
    elif rows == 3:
        if vecs >= 2:
            _g3x2(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
            return j + 2 * _LANES
        _g3x1(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
    elif rows == 2:
        if vecs >= 4:
            _g2x4(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
            return j + 4 * _LANES
        if vecs >= 2:
            _g2x2(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
            return j + 2 * _LANES
        _g2x1(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
    else:  # a row alone: more independent sums instead of shared loads
        if vecs >= 8:
            _g1x8(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
            return j + 8 * _LANES
        if vecs >= 4:
            _g1x4(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
            return j + 4 * _LANES
        if vecs >= 2:
            _g1x2(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
            return j + 2 * _LANES
        _g1x1(xr, wr, yr, x_at, x_rs, wa, n_in, w_rs, w_vs, ya, y_rs)
    return j + _LANES


@njit(cache=True, nogil=True)
def gemv_rows(xr, x_at, x_rs, wr, w_at, panels, yr, y_at, y_rs, rows, n_in, n_out):
    """y_b = x_b w for rows b = 0..rows-1: x_b = xr[x_at + b x_rs:], w = wr[w_at:] (n_in x n_out, row-major,
    or in column panels when `panels`), y_b = yr[y_at + b y_rs:]. Every output summed over i in order, one
    accumulator each. w[i, j] is wr[w_at + j // 8 w_vs + i w_rs + j % 8]."""
    w_rs, w_vs = (PANEL, PANEL * n_in) if panels else (n_out, PANEL)
    wide = n_out // _LANES * _LANES
    b = 0
    while b < rows:
        block = min(rows - b, _ROW_BLOCK)
        xa, ya = x_at + b * x_rs, y_at + b * y_rs
        j = 0
        while j < wide:
            j = _gemv_block(xr, wr, yr, xa, x_rs, w_at, n_in, w_rs, w_vs, ya, y_rs, block, j, wide)
        for r in range(block):  # outputs past the last 8
            for j in range(wide, n_out):
                acc = _F0
                w_j = w_at + j // PANEL * w_vs + j % PANEL
                for i in range(n_in):
                    acc = fma32(xr[xa + r * x_rs + i], weight_at(wr, w_j + i * w_rs), acc)
                yr[ya + r * y_rs + j] = acc
        b += block


@njit(cache=True, nogil=True)
def _region(sf, wf, gf, lf, op, a):
    """The flat float32 region argument a of op lives in."""
    reg = op[1 + ARG_COLS * a]
    if reg == REG_STATE:
        return sf
    if reg == REG_WORK:
        return wf
    if reg == REG_WEIGHT or reg == REG_PANEL:
        return gf
    return lf


@njit(cache=True, nogil=True)
def _rs(op, a):
    return op[1 + ARG_COLS * a + 2]


@njit(cache=True, nogil=True)
def _gemv_arg(sf, wf, gf, lf, op, x, w, y, rows, n_in, n_out):
    """gemv_rows of op's arguments x (per row), w (shared: row-major, panels, or bf16 panels) and y (per row)."""
    xr, yr = _region(sf, wf, gf, lf, op, x), _region(sf, wf, gf, lf, op, y)
    if op[1 + ARG_COLS * w] == REG_PANEL16:
        gemv_rows(xr, _row(op, x, 0), _rs(op, x), gf.view(np.uint16), _row(op, w, 0), True, yr, _row(op, y, 0),
                  _rs(op, y), rows, n_in, n_out)
    else:
        gemv_rows(xr, _row(op, x, 0), _rs(op, x), _region(sf, wf, gf, lf, op, w), _row(op, w, 0),
                  op[1 + ARG_COLS * w] == REG_PANEL, yr, _row(op, y, 0), _rs(op, y), rows, n_in, n_out)


@njit(cache=True, nogil=True)
def _bias_act(yr, y_at, y_rs, br, b_at, rows, n, act):
    for b in range(rows):
        y = yr[y_at + b * y_rs:y_at + b * y_rs + n]
        bias = br[b_at:b_at + n]
        for j in range(n):
            y[j] = _act(y[j] + bias[j], act)


@compiled
@njit(cache=True, nogil=True)
def linear(op, sf, wf, gf, lf, rows, n_in, n_out, act):
    """kernels.linear of every row: y = act(x w + bias); arguments x, w, bias, y."""
    _gemv_arg(sf, wf, gf, lf, op, 0, 1, 3, rows, n_in, n_out)
    _bias_act(_region(sf, wf, gf, lf, op, 3), _row(op, 3, 0), _rs(op, 3), _region(sf, wf, gf, lf, op, 2),
              _row(op, 2, 0), rows, n_out, act)


@compiled
@njit(cache=True, nogil=True)
def gru_cell(op, sf, wf, gf, lf, rows, n_in, H):
    """kernels.gru_cell of every row; arguments x, h, w_ih, w_hh, b_ih, b_hh, gi, gh, h_new."""
    _gemv_arg(sf, wf, gf, lf, op, 0, 2, 6, rows, n_in, 3 * H)
    _bias_act(_region(sf, wf, gf, lf, op, 6), _row(op, 6, 0), _rs(op, 6), _region(sf, wf, gf, lf, op, 4),
              _row(op, 4, 0), rows, 3 * H, 0)
    _gemv_arg(sf, wf, gf, lf, op, 1, 3, 7, rows, H, 3 * H)
    _bias_act(_region(sf, wf, gf, lf, op, 7), _row(op, 7, 0), _rs(op, 7), _region(sf, wf, gf, lf, op, 5),
              _row(op, 5, 0), rows, 3 * H, 0)
    hr, gir, ghr, hnr = (_region(sf, wf, gf, lf, op, 1), _region(sf, wf, gf, lf, op, 6),
                         _region(sf, wf, gf, lf, op, 7), _region(sf, wf, gf, lf, op, 8))
    for b in range(rows):
        h, gi, gh, h_new = (hr[_row(op, 1, b):], gir[_row(op, 6, b):], ghr[_row(op, 7, b):],
                            hnr[_row(op, 8, b):])
        for c in range(H):
            r = _F1 / (_F1 + np.exp(-(gi[c] + gh[c])))
            z = _F1 / (_F1 + np.exp(-(gi[H + c] + gh[H + c])))
            n = np.tanh(gi[2 * H + c] + gh[2 * H + c] * r)
            h_new[c] = (h[c] - n) * z + n
