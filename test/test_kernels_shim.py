"""Every CUDA C kernel in kernels/*.cu, run on the CPU through the shim, against its NumPy twin.

Batched buffers are strided views (row stride larger than the row, NaN in the gaps) like the state
slab's, and outputs start NaN-poisoned, so a wrong stride, an out-of-range read or an unwritten output
shows up. Tolerance: both sides are float32; they differ only in summation order (sequential fma vs
BLAS blocking) and libm (expf/tanhf), so errors stay at a few ulps of O(1) values times sqrt(n):
rtol = atol = 2e-5 (the GRU/attention chains included).
"""
import numpy as np
import pytest
from cuda_on_cpu.cpu_module import CpuRawModule, ShimError
from cuda_on_cpu.shim_backend import module

from flashrt_ros.runtime.engine.launch_table import LAUNCHERS, kernel_dir
from flashrt_ros.runtime.model import kernels as K

TOL = dict(rtol=2e-5, atol=2e-5)
ONLY_NUMPY_SCRATCH = {"tmp", "gi", "gh", "ms", "scores", "chunk_m", "chunk_l", "chunk_acc", "attn_max", "attn_den",
                      "part", "out"}  # written by one side alone
COMPARE = {"causal_conv": ("x", "conv_state", "out"),  # kernels whose `out` both sides write
           "ssm_step": ("x", "h")}  # the rest is the twin's scratch


def rows(rng, B, shape, gap=3, dtype=np.float32, fill=None):
    """A [B, *shape] view whose rows sit `gap` elements apart beyond their size; gaps hold NaN."""
    n = int(np.prod(shape))
    base = np.full((B, n + gap), np.nan if dtype == np.float32 else -7, dtype)
    v = base[:, :n].reshape((B,) + tuple(shape))
    v[...] = rng.standard_normal(v.shape).astype(dtype) if fill is None else fill
    return v


def meta_rows(B, step, kv_len, W=None):
    m = np.full((B, 8 + 5), -7, np.int64)[:, :8]
    m[:, :] = 0
    m[:, K.META_STEP] = step
    m[:, K.META_POS] = step
    m[:, K.META_KV_LEN] = kv_len
    m[:, K.META_RNG] = step + 11 * 2**33  # counters past 32 bits exercise the high word
    return m


def case(name, rng, B, n):
    """(buffers by param name, consts) for kernel `name` at batch B and size n."""
    f = rng.standard_normal
    if name == "obs_norm":
        return dict(obs=rows(rng, B, (n,)), mean=f(n).astype(np.float32), inv_std=f(n).astype(np.float32),
                    x=rows(rng, B, (n,), fill=np.nan)), {}
    if name == "linear":
        m = n + 5
        return dict(x=rows(rng, B, (n,)), w=(f((n, m)) / np.sqrt(n)).astype(np.float32), bias=f(m).astype(np.float32),
                    y=rows(rng, B, (m,), fill=np.nan), tmp=rows(rng, B, (m,))), dict(act=(n + B) % 4)
    if name == "add":
        return dict(x=rows(rng, B, (n,)), y=rows(rng, B, (n,))), {}
    if name == "rmsnorm":
        return dict(x=rows(rng, B, (n,)), g=f(n).astype(np.float32), y=rows(rng, B, (n,), fill=np.nan),
                    ms=np.zeros((B, 1, 1), np.float32)), {}
    if name == "causal_conv":
        k = 4
        return dict(x=rows(rng, B, (n,)), conv_state=rows(rng, B, (k - 1, n)), w=f((k, n)).astype(np.float32),
                    bias=f(n).astype(np.float32), out=rows(rng, B, (n,), fill=np.nan), tmp=rows(rng, B, (n,))), {}
    if name == "gru_cell":
        H = n
        s = 1 / np.sqrt(H)
        return dict(x=rows(rng, B, (n + 3,)), h=rows(rng, B, (H,)), w_ih=(f((n + 3, 3 * H)) * s).astype(np.float32),
                    w_hh=(f((H, 3 * H)) * s).astype(np.float32), b_ih=f(3 * H).astype(np.float32),
                    b_hh=f(3 * H).astype(np.float32), gi=rows(rng, B, (3 * H,)), gh=rows(rng, B, (3 * H,)),
                    h_new=rows(rng, B, (H,), fill=np.nan)), {}
    if name == "ssm_step":
        N = 1 + n % 8  # 8, 2, 1 states per channel
        return dict(x=rows(rng, B, (n,)), xn=rows(rng, B, (n,)), h=rows(rng, B, (n, N)),
                    proj=rows(rng, B, (n + 2 * N,)), a_log=f((n, N)).astype(np.float32),
                    d_skip=f(n).astype(np.float32), dt=rows(rng, B, (n,)), u=rows(rng, B, (n,)),
                    decay=rows(rng, B, (n, N)), dbx=rows(rng, B, (n, N)), y=rows(rng, B, (n,))), {}
    if name == "gru_commit":
        return dict(h=rows(rng, B, (n,)), h_new=rows(rng, B, (n,)), x=rows(rng, B, (n,))), {}
    H = 2 if n % 2 == 0 else 1
    d = n if n % 2 == 0 else n  # head_dim = d / H
    if name == "kv_write":  # each row appends into its own page (as prepare_append guarantees)
        W, pos = 40, 57 + 128 * 3
        P = K.window_pages(W)
        table = np.zeros((B, P), np.int64)
        table[:, (pos // K.KV_PAGE) % P] = np.arange(B) + 2
        return dict(qkv=rows(rng, B, (3 * d,)), k_log=f((B + 3, K.KV_PAGE, d)).astype(np.float32),
                    v_log=f((B + 3, K.KV_PAGE, d)).astype(np.float32), meta=meta_rows(B, pos, W),
                    kv_pages=rows(rng, B, (P,), dtype=np.int64, fill=table)), {}
    if name == "attn_decode":
        return attn_case(rng, B, n, H, d)
    Kc, A = 5, n
    if name == "temporal_ensemble":
        # both blends (decay < 0: the oldest weighs most) and the robot's units (scale, offset)
        return dict(chunk=rows(rng, B, (Kc * A,)), mtp_state=rows(rng, B, (Kc, Kc * A)), meta=meta_rows(B, 2 + n, 0),
                    scale=(1.0 + 3.0 * rng.random(A)).astype(np.float32), offset=f(A).astype(np.float32),
                    action=rows(rng, B, (A,), fill=np.nan), tmp=rows(rng, B, (A,))), \
            dict(decay=0.25 if (n + B) % 2 else -0.3)
    if name == "rng_noise":
        return dict(action=rows(rng, B, (A,)), meta=meta_rows(B, 123, 0)), dict(seed=2**31 + 5, std=0.3)
    if name == "meta_advance":
        return dict(meta=meta_rows(B, 9, 39)), dict(kv_window=40)
    raise KeyError(name)


# (kv_window, kv_len, position) per n: a window inside one page; a full window across a page boundary;
# a 300-slot window over 4 chunks of the page ring after it wrapped several times
ATTN_CASES = {7: (40, 17, 99), 33: (40, 40, 150), 64: (300, 300, 1025)}


def attn_case(rng, B, n, H, d):
    """Every row shares the pages of the older chunks and owns the page of the newest one, like replan
    branches forked from one capsule; stale pages hold random data the window must not see."""
    W, kv_len, pos = ATTN_CASES.get(n, ATTN_CASES[7])
    P, hd = K.window_pages(W), d // H
    table = np.tile(np.arange(P, dtype=np.int64), (B, 1))
    table[:, (pos // K.KV_PAGE) % P] = P + np.arange(B)
    z = np.zeros
    return dict(qkv=rows(rng, B, (3 * d,)), k_log=rng.standard_normal((P + B, K.KV_PAGE, d)).astype(np.float32),
                v_log=rng.standard_normal((P + B, K.KV_PAGE, d)).astype(np.float32), meta=meta_rows(B, pos, kv_len),
                kv_pages=rows(rng, B, (P,), dtype=np.int64, fill=table), out=rows(rng, B, (d,), fill=np.nan),
                scores=z((B, H, P, 1, K.KV_PAGE), np.float32), chunk_m=z((B, H, P, 1, 1), np.float32),
                chunk_l=z((B, H, P, 1, 1), np.float32), chunk_acc=z((B, H, P, hd), np.float32),
                attn_max=z((B, H, 1, 1), np.float32), attn_den=z((B, H, 1, 1), np.float32),
                part=rows(rng, B, (H, P, hd + 2), fill=np.nan), ones=np.ones((K.KV_PAGE, 1), np.float32)), \
        dict(n_heads=H, kv_window=W)


def run_twin_and_shim(name, bufs, consts):
    spec = K.REGISTRY[name]
    a = {k: v.copy() for k, v in bufs.items()}  # copies keep their own (contiguous) layout
    b = {k: _clone_layout(v) for k, v in bufs.items()}
    spec.ref(*(a[p] for p in spec.params), **consts)
    launches = LAUNCHERS[name](*(b[p] for p in spec.params), **consts)
    for la in launches if isinstance(launches, tuple) else (launches,):
        module(la.source).get_function(la.function)(la.grid, la.block, la.args)
    return spec, a, b


def _root(v):
    while v.base is not None:
        v = v.base
    return v


def _clone_layout(v):
    """A copy with the same strides (and NaN gaps) as v."""
    if v.base is None:
        return v.copy()
    root = _root(v)
    offset = v.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return np.ndarray(v.shape, v.dtype, buffer=root.copy(), offset=offset, strides=v.strides)


@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("n", [7, 33, 64])
@pytest.mark.parametrize("name", sorted(K.REGISTRY))
def test_cuda_kernel_on_cpu_matches_numpy_twin(name, B, n):
    rng = np.random.default_rng(hash((name, B, n)) % 2**32)
    bufs, consts = case(name, rng, B, n)
    spec, twin, shim = run_twin_and_shim(name, bufs, consts)
    compare = COMPARE.get(name) or [p for p in spec.writes if p not in ONLY_NUMPY_SCRATCH] or ["out"]
    for p in compare:
        got, want = shim[p], twin[p]
        assert np.isfinite(got).all() or not np.isfinite(want).all(), f"{name}.{p}: unwritten (NaN) outputs"
        if got.dtype.kind == "i":
            assert np.array_equal(got, want), f"{name}.{p}"
        else:
            np.testing.assert_allclose(got, want, err_msg=f"{name}.{p}", **TOL)
        if got.dtype == np.float32 and got.base is not None:  # the gaps between rows stay untouched
            assert np.isnan(_root(got)[:, -3:]).all(), f"{name}.{p}: wrote outside its rows"


def test_shim_rejects_wrong_scalar_sizes_like_a_strict_cupy():
    [la] = LAUNCHERS["add"](np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32))
    fn = module(la.source).get_function(la.function)
    bad = la.args[:-1] + (np.int64(3),)
    with pytest.raises(TypeError, match="parameter is 4 B"):
        fn(la.grid, la.block, bad)
    with pytest.raises(TypeError, match="NumPy scalars"):
        fn(la.grid, la.block, la.args[:-1] + (3,))


def test_shim_reports_partial_warp_shuffles(tmp_path):
    # rmsnorm reduces with full-mask shuffles: a 20-thread block is undefined on a GPU
    [la] = LAUNCHERS["rmsnorm"](np.ones((1, 8), np.float32), np.ones(8, np.float32), np.ones((1, 8), np.float32),
                              np.zeros((1, 1, 1), np.float32))
    with pytest.raises(ShimError, match="absent"):
        module(la.source).get_function(la.function)(la.grid, (20, 1, 1), la.args)


def test_every_kernel_name_has_a_launcher_and_a_cuda_function():
    names = {n for src in kernel_dir().glob("*.cu") for n in CpuRawModule(src).names}
    assert set(K.REGISTRY) <= set(LAUNCHERS)
    rng = np.random.default_rng(0)
    for name in K.REGISTRY:
        bufs, consts = case(name, rng, 2, 8)
        launches = LAUNCHERS[name](*(bufs[p] for p in K.REGISTRY[name].params), **consts)
        for la in launches if isinstance(launches, tuple) else (launches,):
            assert la.function in names


def test_launchers_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="linear shapes"):
        LAUNCHERS["linear"](np.zeros((2, 4), np.float32), np.zeros((5, 3), np.float32), np.zeros(3, np.float32),
                            np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), act=0)
    with pytest.raises(ValueError, match="float32"):
        LAUNCHERS["add"](np.zeros((2, 4), np.float64), np.zeros((2, 4), np.float64))


# H = 8: 32 lanes per unit; 33: 8 lanes and 24 padding threads; 128 (the default d_model): 4 lanes, 88
# rows in registers and 40 read from global; 200: 2 lanes; 512: one lane per unit, the widest block
@pytest.mark.parametrize("n, H", [(1, 8), (37, 33), (20, 64), (9, 128), (6, 200), (3, 512)])
def test_gru_scan_kernel_matches_the_stepwise_scan(n, H):
    from flashrt_ros.runtime.engine.backend import NumpyBackend
    from flashrt_ros.runtime.engine.launch_table import gru_scan as launch_gru_scan
    from flashrt_ros.runtime.model.sequence import gru_scan

    rng = np.random.default_rng(n * H)
    gi = rng.standard_normal((n, 3 * H)).astype(np.float32)
    w_hh = (rng.standard_normal((H, 3 * H)) / np.sqrt(H)).astype(np.float32)
    b_hh = rng.standard_normal(3 * H).astype(np.float32)
    want = gru_scan(NumpyBackend(), gi, w_hh, b_hh)
    got = np.full((n, H), np.nan, np.float32)
    la = launch_gru_scan(gi, w_hh, b_hh, got)
    assert la.block[0] % 32 == 0 and la.block[0] <= 512
    module(la.source).get_function(la.function)(la.grid, la.block, la.args)
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("n, d, N", [(1, 8, 1), (37, 33, 8), (200, 64, 16)])
def test_ssm_scan_kernel_matches_its_twin_and_stepping(n, d, N):
    """The SSM's sequence kernel against its NumPy twin, and the twin against n steps of the step twin."""
    rng = np.random.default_rng(n * d)
    proj = rng.standard_normal((n, d + 2 * N)).astype(np.float32)
    xn = rng.standard_normal((n, d)).astype(np.float32)
    a_log = rng.standard_normal((d, N)).astype(np.float32)
    d_skip = rng.standard_normal(d).astype(np.float32)
    h_twin, y_twin = np.zeros((d, N), np.float32), np.zeros((n, d), np.float32)
    K.ssm_scan_ref(proj, xn, a_log, d_skip, h_twin, y_twin)
    h_cu, y_cu = np.full((d, N), np.nan, np.float32), np.full((n, d), np.nan, np.float32)
    for la in LAUNCHERS["ssm_scan"](proj, xn, a_log, d_skip, h_cu, y_cu):
        module(la.source).get_function(la.function)(la.grid, la.block, la.args)
    np.testing.assert_allclose(h_cu, h_twin, **TOL)
    np.testing.assert_allclose(y_cu, y_twin, **TOL)
    h, x = np.zeros((1, d, N), np.float32), np.zeros((1, d), np.float32)
    scratch = [np.zeros((1, d), np.float32), np.zeros((1, d), np.float32), np.zeros((1, d, N), np.float32),
               np.zeros((1, d, N), np.float32), np.zeros((1, d), np.float32)]
    for t in range(n):
        x[...] = 0.0
        K.ssm_step_ref(x, xn[t:t + 1], h, proj[t:t + 1], a_log, d_skip, *scratch)
        np.testing.assert_allclose(x[0], y_twin[t], **TOL)
    np.testing.assert_allclose(h[0], h_twin, **TOL)


def test_gru_scan_launcher_refuses_what_the_kernel_cannot_hold():
    from flashrt_ros.runtime.engine.launch_table import gru_scan as launch_gru_scan

    H = 513
    with pytest.raises(ValueError, match=r"1 <= H <= GRU_SCAN_MAX_H \(GRU_SCAN_MAX_H=512, H=513\)"):
        launch_gru_scan(np.zeros((2, 3 * H), np.float32), np.zeros((H, 3 * H), np.float32),
                        np.zeros(3 * H, np.float32), np.zeros((2, H), np.float32))


@pytest.mark.parametrize("pos, kv_len, page", [(-1, -1, 0), (-1, -1, -5), (-(2**62), 7, 2**40),
                                              (2**63 - 1, 2**63 - 1, -(2**63))])
def test_hostile_meta_and_page_table_never_index_outside_a_buffer(pos, kv_len, page):
    """A corrupt meta or page table (import validation is the first line; this is the second) gives
    wrong numbers at worst: every kernel reduces its indices into range, so the guard zones around the
    KV log and the ring buffers stay NaN."""
    rng = np.random.default_rng(1)
    B, H, d, W = 2, 2, 16, 300
    P, hd, guard = K.window_pages(W), d // H, 4096
    log_base = np.full((2, 3 * K.KV_PAGE * d + 2 * guard), np.nan, np.float32)
    k_log = log_base[0, guard:guard + 3 * K.KV_PAGE * d].reshape(3, K.KV_PAGE, d)
    v_log = log_base[1, guard:guard + 3 * K.KV_PAGE * d].reshape(3, K.KV_PAGE, d)
    k_log[...] = rng.standard_normal(k_log.shape)
    v_log[...] = rng.standard_normal(v_log.shape)
    meta = np.zeros((B, 8), np.int64)
    meta[:, K.META_POS] = meta[:, K.META_STEP] = pos
    meta[:, K.META_KV_LEN] = kv_len
    table = np.full((B, P), page, np.int64)
    mtp = rows(rng, B, (5, 5 * 3))
    bufs = dict(qkv=rows(rng, B, (3 * d,)), k_log=k_log, v_log=v_log, meta=meta, kv_pages=table)
    launches = list(LAUNCHERS["kv_write"](**bufs))
    launches += LAUNCHERS["attn_decode"](
        **bufs, out=rows(rng, B, (d,)), scores=np.zeros((B, H, P, 1, K.KV_PAGE), np.float32),
        chunk_m=np.zeros((B, H, P, 1, 1), np.float32), chunk_l=np.zeros((B, H, P, 1, 1), np.float32),
        chunk_acc=np.zeros((B, H, P, hd), np.float32), attn_max=np.zeros((B, H, 1, 1), np.float32),
        attn_den=np.zeros((B, H, 1, 1), np.float32), part=rows(rng, B, (H, P, hd + 2)),
        ones=np.ones((K.KV_PAGE, 1), np.float32), n_heads=H, kv_window=W)
    launches += LAUNCHERS["temporal_ensemble"](rows(rng, B, (5 * 3,)), mtp, meta, np.ones(3, np.float32),
                                               np.zeros(3, np.float32), rows(rng, B, (3,)), rows(rng, B, (3,)),
                                               decay=0.25)
    for la in launches:
        module(la.source).get_function(la.function)(la.grid, la.block, la.args)
    assert np.isnan(log_base[:, :guard]).all() and np.isnan(log_base[:, -guard:]).all(), "wrote outside the log"
    assert np.isnan(_root(mtp)[:, -3:]).all(), "wrote outside the mtp ring"
    # the NumPy twins reduce their indices the same way: no IndexError, no write outside
    twin = {k: (v.copy() if k not in ("k_log", "v_log") else v) for k, v in bufs.items()}
    K.REGISTRY["kv_write"].ref(**twin)
    assert np.isnan(log_base[:, :guard]).all() and np.isnan(log_base[:, -guard:]).all()
