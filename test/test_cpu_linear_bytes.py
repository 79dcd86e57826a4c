"""The compiled CPU GEMVs (linear, gru_cell), which run a batch's rows together so each weight load serves up to
4 of them, write for every row the bytes of their row-by-row scalar twin (cpu_linear_ref.py): 1 to 8 rows,
input and output widths on and off the vector width, every activation, inputs in either slab, and whole
steps of the gru and ssm models. The matrices are read row-major or in column panels (cpu_panels.py, what a
bound step reads), float32 or, for bf16 values, 16-bit panels: the same bytes every way."""
from functools import cache

import numpy as np
import pytest
from cpu_linear_ref import gru_cell_ref, linear_ref

from conftest import observation_trace, small_config
from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.engine import cpu_kernels, cpu_linear
from flashrt_ros.runtime.engine.cpu_panels import GEMV_MATRICES, panel_shape, to_panels
from flashrt_ros.runtime.engine.cpu_program import (
    ARG_COLS,
    DIM0,
    N_DIMS,
    PANEL,
    REG_PANEL,
    REG_PANEL16,
    REG_STATE,
    REG_WEIGHT,
    REG_WORK,
)
from flashrt_ros.runtime.model.kernel_spec import ACT_NONE, ACT_RELU, ACT_SILU, ACT_TANH
from flashrt_ros.runtime.model.weights import bf16_values

ROWS = [1, 2, 3, 4, 5, 8]
SLABS = 400_000  # elements of each synthetic slab (each test copies all four twice: kept small)
PANELS_AT = 250_000  # where the panel copies go in the weight slab (past every row-major matrix and bias)
LAYOUTS = ["row-major", "panels", "bf16-panels"]


@cache
def _slabs(seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(SLABS, dtype=np.float32) * np.float32(s) for s in (1.0, 2.0, 0.3, 1.0))


def _op(kernel, args, dims):
    """An encoded op; args: (region, offset, row stride, elements per row) per buffer."""
    op = np.zeros(DIM0 + N_DIMS, np.int64)
    op[0] = kernel
    for a, cols in enumerate(args):
        op[1 + ARG_COLS * a:1 + ARG_COLS * (a + 1)] = cols
    op[DIM0:DIM0 + len(dims)] = dims
    return op


def _view(slabs, cols, b):
    reg, off, stride, n = cols
    slab = {REG_STATE: slabs[0], REG_WORK: slabs[1], REG_WEIGHT: slabs[2]}[reg]
    return slab[off + b * stride:off + b * stride + n]


def _with_panels(args, matrices, layout, slabs_copies):
    """args with each matrix argument {a: (n_in, n_out)} pointed at a panel copy written into the weight slab of
    every copy (so the twin's slabs match there too); args unchanged for row-major."""
    if layout == "row-major":
        return args
    args, at = list(args), PANELS_AT
    for a, (n_in, n_out) in matrices.items():
        reg, off, _, n = args[a]
        assert reg == REG_WEIGHT and n == n_in * n_out and at + n_in * n_out + 8 * n_in < SLABS
        w = _slabs()[2][off:off + n]
        if layout == "bf16-panels":  # the matrix's values made bf16 in every copy: the twin reads them row-major
            w = bf16_values(w)
            for slabs in slabs_copies:
                slabs[2][off:off + n] = w
        panels = to_panels(w.reshape(n_in, n_out))
        for slabs in slabs_copies:
            if layout == "bf16-panels":
                slabs[2].view(np.uint16)[2 * at + 1:2 * at + 1 + panels.size] = panels.view(np.uint32) >> 16
            else:
                slabs[2][at:at + panels.size] = panels
        args[a] = (REG_PANEL16, 2 * at + 1, 0, n) if layout == "bf16-panels" else (REG_PANEL, at, 0, n)
        at += panels.size + 3  # off the cache line (and, at 16 bits, off the float): nothing assumes alignment
    return args


def _assert_same_bytes(run, run_ref, args, rows, matrices=None, layout="row-major"):
    """run on copies of the slabs, run_ref row by row on other copies: every slab byte-identical. run takes the
    encoded op's args (matrices in `layout`), run_ref the row-major views."""
    got, want = [s.copy() for s in _slabs()], [s.copy() for s in _slabs()]
    run(*got, args=_with_panels(args, matrices or {}, layout, (got, want)))
    for b in range(rows):
        run_ref(*[_view(want, cols, b) for cols in args])
    for name, g, w in zip(("small slab", "work slab", "weights", "KV log"), got, want):
        assert g.tobytes() == w.tobytes(), f"{name} differs from the row-by-row twin"
    assert not np.array_equal(got[1], _slabs()[1])  # it did write its outputs


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n_in, n_out", [(1, 1), (14, 128), (37, 7), (128, 384), (256, 128), (128, 56),
                                         (9, 13), (64, 40), (33, 200)])
@pytest.mark.parametrize("x_slab, layout", [(REG_WORK, "row-major"), (REG_STATE, "row-major"), (REG_WORK, "panels"),
                                            (REG_WORK, "bf16-panels")])
def test_linear_bytes_equal_the_row_by_row_twin_for_every_batch_and_width(rows, n_in, n_out, x_slab, layout):
    x_rs, y_rs = n_in + 3, n_out + 5  # row strides past the row: the padding is never written
    for act in (ACT_NONE, ACT_SILU, ACT_TANH, ACT_RELU):
        args = [(x_slab, 1000 + act, x_rs, n_in), (REG_WEIGHT, 17 + act * 7, 0, n_in * n_out),
                (REG_WEIGHT, 215_001, 0, n_out), (REG_WORK, 200_003, y_rs, n_out)]

        def run(sf, wf, gf, lf, args, act=act):
            op = _op(cpu_kernels.K_LINEAR, args, [n_in, n_out, act])
            cpu_linear.linear(op, sf, wf, gf, lf, rows, n_in, n_out, act)

        def run_ref(x, w, bias, y, act=act):
            linear_ref(x, w, bias, y, n_in, n_out, act)

        _assert_same_bytes(run, run_ref, args, rows, {1: (n_in, n_out)}, layout)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n_in, H", [(128, 128), (14, 5), (32, 32), (20, 24)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gru_cell_bytes_equal_the_row_by_row_twin_for_every_batch_and_width(rows, n_in, H, layout):
    G = 3 * H
    args = [(REG_WORK, 101, n_in + 1, n_in), (REG_STATE, 7, H + 2, H), (REG_WEIGHT, 0, 0, n_in * G),
            (REG_WEIGHT, 100_000, 0, H * G), (REG_WEIGHT, 200_000, 0, G), (REG_WEIGHT, 210_000, 0, G),
            (REG_WORK, 100_000, G, G), (REG_WORK, 110_000, G + 1, G), (REG_WORK, 120_000, H, H)]

    def run(sf, wf, gf, lf, args):
        cpu_linear.gru_cell(_op(cpu_kernels.K_GRU, args, [n_in, H]), sf, wf, gf, lf, rows, n_in, H)

    def run_ref(x, h, w_ih, w_hh, b_ih, b_hh, gi, gh, h_new):
        gru_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh, gi, gh, h_new, n_in, H)

    _assert_same_bytes(run, run_ref, args, rows, {2: (n_in, G), 3: (H, G)}, layout)


def test_panels_hold_every_column_of_every_input_row_in_panel_order():
    w = np.arange(5 * 19, dtype=np.float32).reshape(5, 19)
    p = to_panels(w).reshape(3, 5, PANEL)  # 19 columns: 3 panels, the last padded with zeros
    for i in range(5):
        for j in range(19):
            assert p[j // PANEL, i, j % PANEL] == w[i, j]
    assert not p[2, :, 3:].any()


@cache
def _session(mixer: str, small: bool) -> Session:
    if small:
        return Session(small_config(mixer=mixer, kv_window=48, capsule_budget_mb=4.0, capsule_capacity=0),
                       backend="cpu")
    return Session(PolicyConfig(kv_window=256, mixer=mixer, capsule_budget_mb=24.0, capsule_capacity=0),
                   backend="cpu")


def _regions_copy(batch):
    """Copies of the batch's regions; the int64 view aliases the small slab as in the arena."""
    sf, _, wf, gf, lf = batch._regions
    sf = sf.copy()
    return [sf, sf.view(np.int64), wf.copy(), gf.copy(), lf.copy()]


def _from_panels(gf, off, n_in, n_out, half=False):
    """The row-major matrix of a panel copy (the inverse of to_panels), flat; 16-bit panels at `half`."""
    n_panels = -(-n_out // PANEL)
    n = n_panels * PANEL * n_in
    flat = (gf.view(np.uint16)[off:off + n].astype(np.uint32) << 16).view(np.float32) if half else gf[off:off + n]
    panels = flat.reshape(n_panels, n_in, PANEL)
    return np.ascontiguousarray(panels.transpose(1, 0, 2).reshape(n_in, -1)[:, :n_out]).reshape(-1)


def _run_ref(batch, regions):
    """The step op by op: linear and gru_cell by the row-by-row twin on row-major matrices, every other op by
    the compiled kernel."""
    sf, si, wf, gf, lf = regions
    slabs = {REG_STATE: sf, REG_WORK: wf, REG_WEIGHT: gf}
    for o, op in enumerate(batch.prog):
        if op[0] not in (cpu_kernels.K_LINEAR, cpu_kernels.K_GRU):
            cpu_kernels.run_program(batch.prog[o:o + 1], batch.fconst[o:o + 1], *regions, batch.rows)
            continue
        kernel = "linear" if op[0] == cpu_kernels.K_LINEAR else "gru_cell"
        n_args = 4 if op[0] == cpu_kernels.K_LINEAR else 9
        dims = [int(v) for v in op[DIM0:DIM0 + 3]]
        for b in range(batch.rows):
            views = []
            for a in range(n_args):
                reg, off, stride, n = op[1 + ARG_COLS * a:1 + ARG_COLS * (a + 1)]
                if reg in (REG_PANEL, REG_PANEL16):
                    views.append(_from_panels(gf, off, *panel_shape(kernel, a, dims), half=reg == REG_PANEL16))
                else:
                    views.append(slabs[reg][off + b * stride:off + b * stride + n])
            if op[0] == cpu_kernels.K_LINEAR:
                linear_ref(*views, *dims)
            else:
                gru_cell_ref(*views, *dims[:2])


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("mixer, small", [("gru", False), ("ssm", False), ("gru", True), ("ssm", True)])
def test_whole_batched_steps_equal_the_step_with_row_by_row_gemvs(mixer, small, rows):
    """Rows start as copies of the live row, each gets its own observations; three steps one way and the
    other: every region byte-identical."""
    s = _session(mixer, small)
    obs = observation_trace(40 + 3 * rows, obs_dim=s.cfg.obs_dim, seed=rows)
    if s.arena["meta"][0, 0] == 0:
        for o in obs[:40]:
            s.step(o)
    for r in range(1, rows + 1):
        s.arena.state[r] = s.arena.state[0]
    batch = s.backend.bind(s.plan, s.arena, 1, rows)
    matrices = [a for op in batch.prog for a in range(4) if op[1 + ARG_COLS * a] == REG_PANEL16]
    assert len(matrices) == sum(len(GEMV_MATRICES[k]) for k in (op.kernel for op in s.plan.ops)
                                if k in GEMV_MATRICES)  # the step reads every (seeded: bf16) matrix at 16 bits
    got, want = _regions_copy(batch), _regions_copy(batch)
    obs_cols = next(op for op in batch.prog if op[0] == cpu_kernels.K_OBS_NORM)[1:1 + ARG_COLS]
    assert obs_cols[0] in (REG_STATE, REG_WORK)
    for step in range(3):
        for regions in (got, want):
            slab = regions[0] if obs_cols[0] == REG_STATE else regions[2]
            for b in range(rows):
                at = obs_cols[1] + b * obs_cols[2]
                slab[at:at + obs_cols[3]] = obs[40 + step * rows + b]
        cpu_kernels.run_program(batch.prog, batch.fconst, *got, rows)
        _run_ref(batch, want)
        for name, g, w in zip(("small slab", "int slab", "work slab", "weights", "KV log"), got, want):
            assert g.tobytes() == w.tobytes(), f"step {step}: the {name} differs from the row-by-row twin"


def _matrix_regions(s: Session) -> dict[tuple[int, int], int]:
    """(op, argument) -> the region its GEMV matrix is read from, in the bound live step."""
    return {(o, a): int(op[1 + ARG_COLS * a]) for o, op in enumerate(s._live.prog)
            for a in GEMV_MATRICES.get(s.plan.ops[o].kernel, ())}


def test_seeded_weights_are_bf16_values_and_the_step_reads_every_matrix_at_16_bits():
    s = Session(small_config(capsule_budget_mb=4.0, capsule_capacity=0), backend="cpu")
    for name, w in s.weights.items():
        assert w.dtype != np.float32 or not (w.view(np.uint32) & 0xFFFF).any(), name
    assert set(_matrix_regions(s).values()) == {REG_PANEL16}


def test_a_matrix_off_bf16_by_one_bit_is_read_at_32_bits_and_the_step_agrees_with_numpy():
    """A loaded policy is never rounded: one float32 matrix, one weight a bit off bf16, keeps 32 bits (the others
    stay at 16), and the compiled step computes that weight as it is."""
    cfg = small_config(capsule_budget_mb=4.0, capsule_capacity=0)
    weights = dict(Session(cfg, backend="numpy").weights)
    o, a = next(iter(_matrix_regions(Session(cfg, backend="cpu"))))
    name = Session(cfg, backend="numpy").plan.ops[o].args[a]
    w = weights[name].copy()
    w.reshape(-1).view(np.uint32)[5] += 1
    weights[name] = w
    ref, cpu = Session(cfg, backend="numpy", weights=weights), Session(cfg, backend="cpu", weights=weights)
    regions = _matrix_regions(cpu)
    assert regions.pop((o, a)) == REG_PANEL and set(regions.values()) == {REG_PANEL16}
    for x in observation_trace(60, obs_dim=cfg.obs_dim):
        np.testing.assert_allclose(cpu.step(x).action, ref.step(x).action, rtol=0, atol=2e-5)
