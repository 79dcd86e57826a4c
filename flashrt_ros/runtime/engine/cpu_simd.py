"""The vector blocks of the compiled CPU step (cpu_attention.py, cpu_linear.py) as numba intrinsics that emit
LLVM IR directly: numba vectorises only innermost loops, and these sums run in order across the natural loop.
Each vector lane is one independent sum (a slot, a channel or an output), advanced by a fused multiply-add
(llvm.fma: one rounding, IEEE-exact, so the same bytes on every CPU) and never reassociated, so a lane computes
the bytes of the scalar loop it stands for (`fma32` in that loop); rows in a block share each load."""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_LANES = 8  # float32 lanes of one vector: 256 bits (two 128-bit registers on NEON)
_VEC = ir.VectorType(ir.FloatType(), _LANES)


def _shuffle(builder, a, b, mask):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), _LANES), mask))


def _transpose8(builder, rows):
    """rows[i][e] (slot i, channel e) -> cols[e][i]: the 8x8 transpose in three rounds of two-input shuffles."""
    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    t = [_shuffle(builder, rows[i], rows[i + 1], m) for i in range(0, 8, 2) for m in (lo, hi)]
    lo, hi = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    u = [_shuffle(builder, t[a], t[a + 2], m) for a in (0, 1, 4, 5) for m in (lo, hi)]
    lo, hi = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    return [_shuffle(builder, u[i], u[i + 4], m) for m in (lo, hi) for i in range(4)]


def _fma(builder, a, b, c):
    """a * b + c, rounded once: llvm.fma of the operands' type (vector or float)."""
    name = "llvm.fma.v8f32" if a.type == _VEC else "llvm.fma.f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3), name)
    return builder.call(fn, [a, b, c])


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c for float32, rounded once: the scalar step of every sum the vector blocks below compute (where
    the CPU has no FMA unit, llvm.fma calls libm's fmaf: the same bytes, slower)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return _fma(builder, *args)

    return sig, codegen


def _splat(builder, x):
    v = builder.insert_element(ir.Constant(_VEC, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return _shuffle(builder, v, v, [0] * _LANES)


def _scores_intrinsic(rows):
    """An intrinsic for the scores of 8 slots for `rows` rows: wf[s_at + r s_rs + i] = _dot(q_r, k_i, hd) * scale,
    k_i = lf[k_at + i d:], q_r = wf[q_at + r q_rs:]. One vector lane per slot, each lane summing q[0] k_i[0] +
    q[1] k_i[1] + ... in channel order, one fused multiply-add per channel: _dot's bytes for every slot and
    row. The keys load 8 channels of 8 slots at a time and transpose in registers, once for all the rows."""

    @intrinsic
    def scores(typingctx, wf, lf, q_at, q_rs, k_at, d, hd, s_at, s_rs, scale):
        i8 = types.int64
        sig = types.void(wf, lf, i8, i8, i8, i8, i8, i8, i8, types.float32)

        def codegen(context, builder, signature, args):
            wf_v, lf_v, q_at, q_rs, k_at, d, hd, s_at, s_rs, scale = args
            wfp = context.make_array(signature.args[0])(context, builder, wf_v).data
            lfp = context.make_array(signature.args[1])(context, builder, lf_v).data
            i64 = ir.IntType(64)
            q_row = [builder.add(q_at, builder.mul(q_rs, i64(r))) for r in range(rows)]
            accs = [cgutils.alloca_once_value(builder, ir.Constant(_VEC, [0.0] * _LANES)) for _ in range(rows)]

            def accumulate(q_idx, cols):  # acc_r += q_r[e] * col_e, e in order
                for r, acc in enumerate(accs):
                    a = builder.load(acc)
                    for e, col in zip(q_idx, cols):
                        q = builder.load(builder.gep(wfp, [builder.add(q_row[r], e)]))
                        a = _fma(builder, _splat(builder, q), col, a)
                    builder.store(a, acc)

            full = builder.mul(builder.sdiv(hd, i64(_LANES)), i64(_LANES))
            with cgutils.for_range_slice(builder, i64(0), full, i64(_LANES), inc=True) as (e0, _):
                keys = []
                for i in range(_LANES):
                    at = builder.add(k_at, builder.add(builder.mul(d, i64(i)), e0))
                    keys.append(builder.load(builder.bitcast(builder.gep(lfp, [at]), _VEC.as_pointer()), align=4))
                accumulate([builder.add(e0, i64(c)) for c in range(_LANES)], _transpose8(builder, keys))
            with cgutils.for_range(builder, hd, start=full) as loop:  # channels past the last 8
                e = loop.index
                k = ir.Constant(_VEC, ir.Undefined)
                for i in range(_LANES):
                    at = builder.add(k_at, builder.add(builder.mul(d, i64(i)), e))
                    k = builder.insert_element(k, builder.load(builder.gep(lfp, [at])), ir.Constant(ir.IntType(32), i))
                accumulate([e], [k])
            for r, acc in enumerate(accs):
                out = builder.gep(wfp, [builder.add(s_at, builder.mul(s_rs, i64(r)))])
                builder.store(builder.fmul(builder.load(acc), _splat(builder, scale)),
                              builder.bitcast(out, _VEC.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return scores


_scores4, _scores2, _scores1 = _scores_intrinsic(4), _scores_intrinsic(2), _scores_intrinsic(1)


def _values_intrinsic(rows, blocks):
    """An intrinsic for acc_r[e] += p_r[t] v_t[e], t = 0..n-1 in order, for `rows` rows and 8 * blocks channels,
    8 to a vector lane: p_r = wf[p_at + r p_rs:], v_t = lf[v_at + t d:], acc_r = wf[acc_at + r acc_rs:]. Every
    sum stays in a register across the slots (independent chains); the rows share each value load."""

    @intrinsic
    def values(typingctx, wf, lf, p_at, p_rs, v_at, d, n, acc_at, acc_rs):
        i8 = types.int64
        sig = types.void(wf, lf, i8, i8, i8, i8, i8, i8, i8)

        def codegen(context, builder, signature, args):
            wf_v, lf_v, p_at, p_rs, v_at, d, n, acc_at, acc_rs = args
            wfp = context.make_array(signature.args[0])(context, builder, wf_v).data
            lfp = context.make_array(signature.args[1])(context, builder, lf_v).data
            i64 = ir.IntType(64)
            p_row = [builder.add(p_at, builder.mul(p_rs, i64(r))) for r in range(rows)]
            outs = [[builder.bitcast(builder.gep(wfp, [builder.add(builder.add(acc_at, builder.mul(acc_rs, i64(r))),
                                                                   i64(_LANES * k))]), _VEC.as_pointer())
                     for k in range(blocks)] for r in range(rows)]
            accs = [[cgutils.alloca_once_value(builder, builder.load(o, align=4)) for o in row] for row in outs]
            with cgutils.for_range(builder, n) as loop:
                t = loop.index
                at = builder.add(v_at, builder.mul(t, d))
                v = [builder.load(builder.bitcast(builder.gep(lfp, [builder.add(at, i64(_LANES * k))]),
                                                  _VEC.as_pointer()), align=4) for k in range(blocks)]
                for r in range(rows):
                    p = _splat(builder, builder.load(builder.gep(wfp, [builder.add(p_row[r], t)])))
                    for k in range(blocks):
                        builder.store(_fma(builder, p, v[k], builder.load(accs[r][k])), accs[r][k])
            for row_outs, row_accs in zip(outs, accs):
                for o, acc in zip(row_outs, row_accs):
                    builder.store(builder.load(acc), o, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return values


_values_2x32, _values_1x32 = _values_intrinsic(2, 4), _values_intrinsic(1, 4)
_values_2x8, _values_1x8 = _values_intrinsic(2, 1), _values_intrinsic(1, 1)


_VEC16 = ir.VectorType(ir.IntType(16), _LANES)


def _weights8(builder, wp, at, half):
    """8 weights from wp[at:at + 8] as float32: float32 as they are, or bf16 (uint16) widened exactly: its bits
    are the upper half of the float32's."""
    if not half:
        return builder.load(builder.bitcast(builder.gep(wp, [at]), _VEC.as_pointer()), align=4)
    raw = builder.load(builder.bitcast(builder.gep(wp, [at]), _VEC16.as_pointer()), align=2)
    wide = builder.shl(builder.zext(raw, ir.VectorType(ir.IntType(32), _LANES)),
                       ir.Constant(ir.VectorType(ir.IntType(32), _LANES), [16] * _LANES))
    return builder.bitcast(wide, _VEC)


@intrinsic
def weight_at(typingctx, wr, idx):
    """wr[idx] as float32: a float32 as it is, a bf16 (uint16) widened exactly."""
    sig = types.float32(wr, types.int64)

    def codegen(context, builder, signature, args):
        wr_v, idx = args
        ptr = builder.gep(context.make_array(signature.args[0])(context, builder, wr_v).data, [idx])
        if signature.args[0].dtype != types.uint16:
            return builder.load(ptr)
        wide = builder.shl(builder.zext(builder.load(ptr), ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return sig, codegen


def _gemv_intrinsic(rows, vecs):
    """An intrinsic for y_r[j0 + e] = sum_i x_r[i] w[i, j0 + e], i = 0..n_in-1 in order, for `rows` rows and
    8 * vecs outputs e, 8 to a vector lane: x_r = xr[x_at + r x_rs:], y_r = yr[y_at + r y_rs:], and the weight
    vector k of input i at wr[w_at + i w_rs + k w_vs] (row-major: w_rs = n_out, w_vs = 8; panels: w_rs = 8,
    w_vs = 8 n_in). Each weight vector is loaded once for all the rows; from a uint16 wr (bf16 panels) it is
    widened exactly (_weights8)."""

    @intrinsic
    def gemv(typingctx, xr, wr, yr, x_at, x_rs, w_at, n_in, w_rs, w_vs, y_at, y_rs):
        i8 = types.int64
        sig = types.void(xr, wr, yr, i8, i8, i8, i8, i8, i8, i8, i8)

        def codegen(context, builder, signature, args):
            xr_v, wr_v, yr_v, x_at, x_rs, w_at, n_in, w_rs, w_vs, y_at, y_rs = args
            xp, wp, yp = (context.make_array(t)(context, builder, v).data
                          for t, v in zip(signature.args[:3], (xr_v, wr_v, yr_v)))
            half = signature.args[1].dtype == types.uint16
            i64 = ir.IntType(64)
            x_row = [builder.add(x_at, builder.mul(x_rs, i64(r))) for r in range(rows)]
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(_VEC, [0.0] * _LANES)) for _ in range(vecs)]
                    for _ in range(rows)]
            with cgutils.for_range(builder, n_in) as loop:
                i = loop.index
                w_i = builder.add(w_at, builder.mul(i, w_rs))
                w = [_weights8(builder, wp, builder.add(w_i, builder.mul(w_vs, i64(k))), half) for k in range(vecs)]
                for r in range(rows):
                    x = builder.load(builder.gep(xp, [builder.add(x_row[r], i)]))
                    xs = _splat(builder, x)
                    for k in range(vecs):
                        builder.store(_fma(builder, xs, w[k], builder.load(accs[r][k])), accs[r][k])
            for r in range(rows):
                y_r = builder.add(y_at, builder.mul(y_rs, i64(r)))
                for k in range(vecs):
                    out = builder.bitcast(builder.gep(yp, [builder.add(y_r, i64(_LANES * k))]), _VEC.as_pointer())
                    builder.store(builder.load(accs[r][k]), out, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return gemv


# (rows, vectors of outputs): up to 8 vector sums held in registers per block, fewer for the last outputs
_g4x2, _g4x1 = _gemv_intrinsic(4, 2), _gemv_intrinsic(4, 1)
_g3x2, _g3x1 = _gemv_intrinsic(3, 2), _gemv_intrinsic(3, 1)
_g2x4, _g2x2, _g2x1 = _gemv_intrinsic(2, 4), _gemv_intrinsic(2, 2), _gemv_intrinsic(2, 1)
_g1x8, _g1x4, _g1x2, _g1x1 = _gemv_intrinsic(1, 8), _gemv_intrinsic(1, 4), _gemv_intrinsic(1, 2), _gemv_intrinsic(1, 1)


@intrinsic
def prefetch(typingctx, arr, idx):
    """A hint to load the cache line of arr[idx] (llvm.prefetch: read, keep in every level). No effect on any
    value; a long window's pages are not contiguous, so the CPU's own prefetcher stops at each."""
    sig = types.void(arr, types.int64)

    def codegen(context, builder, signature, args):
        arr_v, idx = args
        ptr = builder.gep(context.make_array(signature.args[0])(context, builder, arr_v).data, [idx])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen
