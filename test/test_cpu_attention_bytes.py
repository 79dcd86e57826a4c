"""The compiled CPU attention writes, for every row of every batch, the bytes of its scalar twin
(cpu_attention_ref.py, the kernel before its batched restructure): 1 to 8 rows, windows short, partial,
wrapped and long, rows in lockstep, with private pages, at other positions, over random q, keys and values."""
from functools import cache

import numpy as np
import pytest
from cpu_attention_ref import attn_decode_ref

from conftest import small_config
from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.engine import cpu_attention, cpu_kernels
from flashrt_ros.runtime.engine.cpu_program import ARG_COLS, DIM0, N_DIMS
from flashrt_ros.runtime.model.kernel_spec import META_KV_LEN, META_POS

Q, META, PAGES, OUT, PART = 0, 3, 4, 5, 12  # attn_decode's buffer arguments (kernel_spec.py)


@cache
def _session(window: int, mixer: str = "gru", small: bool = False, d_model: int = 32, n_heads: int = 2) -> Session:
    if small:  # n_heads heads of d_model // n_heads channels
        return Session(small_config(kv_window=window, mixer=mixer, d_model=d_model, n_heads=n_heads,
                                    capsule_budget_mb=4.0, capsule_capacity=0), backend="cpu")
    budget = 14.0 + window / 128  # the KV pages 9 rows need and a few capsules: a small arena to fill
    return Session(PolicyConfig(kv_window=window, mixer=mixer, capsule_budget_mb=budget), backend="cpu")


def _arg(op, a):
    c = 1 + ARG_COLS * a
    return int(op[c + 1]), int(op[c + 2]), int(op[c + 3])  # offset, row stride, size


def _rows_of(op, a, rows):
    off, stride, n = _arg(op, a)
    return np.concatenate([np.arange(off + b * stride, off + b * stride + n) for b in range(rows)])


def _inputs(s: Session, rows: int, layout: str, fill: str, seed: int):
    """The first attention op of a plan bound to arena rows 1..rows, over random regions: q, the KV log and
    the work slab random; each row's meta and page table as `layout` says."""
    batch = s.backend.bind(s.plan, s.arena, 1, rows)
    op = next(o for o in batch.prog if o[0] == cpu_kernels.K_ATTN).copy()
    n_pages, P, d, n_heads, window = (int(v) for v in op[DIM0:DIM0 + N_DIMS][:5])
    rng = np.random.default_rng(seed)
    sf, si, wf, gf, lf = (r.copy() for r in batch._regions)
    lf[:] = rng.standard_normal(lf.size, dtype=np.float32)
    wf[:] = rng.standard_normal(wf.size, dtype=np.float32) * np.float32(3.0)  # q: some scores under the floor
    kv_len = window if fill == "wrapped" else window * 3 // 5
    pos = 7 * window + 37 if fill == "wrapped" else kv_len
    base = rng.permutation(n_pages)[:P]
    for b in range(rows):
        meta_off, meta_rs, _ = _arg(op, META)
        pages_off, pages_rs, _ = _arg(op, PAGES)
        meta, pages = si[meta_off + b * meta_rs:], si[pages_off + b * pages_rs:pages_off + b * pages_rs + P]
        row_pos, table = pos, base.copy()
        if layout == "private_tail":  # a replan's branches: the window shared, the page being written private
            table[(pos // 128) % P] = (base[(pos // 128) % P] + 1 + b) % n_pages
        elif layout == "two_positions":
            row_pos = pos - 3 * (b % 2)
        elif layout == "own_pages":
            table, row_pos = rng.permutation(n_pages)[:P], pos + b
        meta[META_POS], meta[META_KV_LEN] = row_pos, min(kv_len, row_pos)
        pages[:] = table
    return op, (sf, si, wf, gf, lf), (rows, n_pages, P, d, n_heads, window)


def _assert_same_bytes_as_the_twin(s, rows, layout, fill, seed=0):
    op, regions, dims = _inputs(s, rows, layout, fill, seed)
    want, got = [r.copy() for r in regions], [r.copy() for r in regions]
    attn_decode_ref(op, *want, *dims)
    cpu_attention.attn_decode(op, *got, *dims)
    out = _rows_of(op, OUT, rows)
    assert got[2][out].tobytes() == want[2][out].tobytes(), "attention output differs from the scalar twin"
    assert not np.array_equal(got[2][out], regions[2][out])  # it did write the output
    for name, g, r in zip(("small slab", "int slab", "work slab", "weights", "KV log"), got, regions):
        keep = np.ones(r.size, bool)
        if name == "work slab":  # its own outputs and scratch: out .. part
            for a in range(OUT, PART + 1):
                keep[_rows_of(op, a, rows)] = False
        assert np.array_equal(g[keep], r[keep]), f"attention wrote the {name} outside its own buffers"


@pytest.mark.parametrize("fill", ["partial", "wrapped"])
@pytest.mark.parametrize("layout", ["lockstep", "private_tail", "two_positions", "own_pages"])
@pytest.mark.parametrize("rows", [1, 3, 4, 8])
@pytest.mark.parametrize("window", [128, 300, 1024, 4096])
def test_attention_bytes_equal_the_scalar_twin_for_every_batch_and_page_layout(window, rows, layout, fill):
    _assert_same_bytes_as_the_twin(_session(window), rows, layout, fill)


@pytest.mark.parametrize("mixer", ["gru", "ssm"])
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("layout", ["lockstep", "private_tail", "own_pages"])
def test_attention_bytes_equal_the_scalar_twin_at_head_width_16(mixer, rows, layout):
    _assert_same_bytes_as_the_twin(_session(48, mixer, small=True), rows, layout, "wrapped", seed=rows)


@pytest.mark.parametrize("rows", [1, 3, 4, 7])
@pytest.mark.parametrize("head_width", [4, 9, 40])  # under one vector, one and a channel, 32 + 8
def test_attention_bytes_equal_the_scalar_twin_at_head_widths_off_the_vector_width(head_width, rows):
    s = _session(200, small=True, d_model=2 * head_width)
    for layout in ("lockstep", "private_tail", "two_positions"):
        _assert_same_bytes_as_the_twin(s, rows, layout, "wrapped", seed=head_width)


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize("n_heads", [1, 3, 5])  # rows x heads odd: the softmax chains end in groups of 2 and 1
def test_attention_bytes_equal_the_scalar_twin_for_odd_head_counts(n_heads, rows):
    s = _session(200, small=True, d_model=8 * n_heads, n_heads=n_heads)
    for layout in ("lockstep", "private_tail", "own_pages"):
        _assert_same_bytes_as_the_twin(s, rows, layout, "wrapped", seed=n_heads)


@pytest.mark.parametrize("layout", ["lockstep", "private_tail"])
def test_attention_bytes_equal_the_scalar_twin_with_the_ssm_mixer(layout):
    _assert_same_bytes_as_the_twin(_session(1024, "ssm"), 8, layout, "wrapped", seed=5)
