"""One spec per kernel: its buffers (dtype, shape rule, access), constants and CUDA functions, written once.

The NumPy twins (kernels.py) take their parameter list and bind-time checks from here, the CUDA launch
table (engine/launch_table.py) builds every argument list from here, and test_kernel_specs.py checks each
``extern "C"`` signature in kernels/*.cu against ``c_signature``. The constants shared with the CUDA C
sources are defined here only and reach the compilers as ``-D`` flags (``cuda_defines``).

Shape rules are dimension expressions over symbols: a bare name binds to the size it meets first (``B``,
``d``), anything else (``3*H``, ``hd+2``, ``KV_PAGE``) is evaluated and checked. A buffer whose first dim
is ``B`` is batched: CUDA gets it as (pointer to row 0, row stride ``<name>_rs``) and its rows must be
contiguous; any other buffer goes whole and must be C-contiguous.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# ---- constants shared with kernels/*.cu (the only definition; see cuda_defines) ----------------
META_STEP, META_POS, META_KV_LEN, META_RNG = 0, 1, 2, 3  # meta layout (int64 per row)
META_LEN = 8  # room for more counters without a layout change
KV_PAGE = 128  # log entries per page = keys per attention chunk = CUDA split
ATTN_THREADS = 128  # threads per attention block
ATTN_MAX_HD = 64
GRU_SCAN_MAX_H = 512  # widest hidden state the one-block GRU scan holds (its shared h and block size)
SSM_MAX_N = 16  # most states per channel the SSM scan keeps in registers
ACT_NONE, ACT_SILU, ACT_TANH, ACT_RELU = 0, 1, 2, 3
RMS_EPS = np.float32(1e-5)
SCORE_FLOOR = np.float32(-60.0)  # softmax logits below max - 60 weigh < 1e-26: clamp, don't underflow

CUDA_CONSTANTS = ("META_STEP", "META_POS", "META_KV_LEN", "META_RNG", "META_LEN", "KV_PAGE", "ATTN_THREADS",
                  "ATTN_MAX_HD", "GRU_SCAN_MAX_H", "SSM_MAX_N", "ACT_NONE", "ACT_SILU", "ACT_TANH", "ACT_RELU",
                  "RMS_EPS", "SCORE_FLOOR")
_FLOAT_CONSTANTS = {"RMS_EPS", "SCORE_FLOOR"}


def cuda_defines() -> tuple[str, ...]:
    """The shared constants as compiler flags, for NVRTC, CuPy's RawModule and the CPU shim build."""
    g = globals()
    out = []
    for name in CUDA_CONSTANTS:
        v = g[name]
        # float32 values printed exactly: the C literal rounds to the same float
        out.append(f"-D{name}=({float(v)!r}f)" if name in _FLOAT_CONSTANTS else f"-D{name}={int(v)}")
    return tuple(out)


# ---- specs ---------------------------------------------------------------------------------------
C_TYPES = {"f32": "float", "i64": "i64", "i32": "int", "u32": "unsigned"}
NP_TYPES = {"f32": np.float32, "i64": np.int64, "i32": np.int32, "u32": np.uint32}


@dataclass(frozen=True)
class Buf:
    name: str
    dtype: str  # f32 | i64
    dims: tuple[str, ...]
    access: str  # r | w | rw

    @property
    def batched(self) -> bool:
        return self.dims[:1] == ("B",)


@dataclass(frozen=True)
class CudaFn:
    source: str  # kernels/<source>
    name: str
    args: tuple[str, ...]  # buffer, <buffer>_rs, constant or symbol; "sym:i64" gives a symbol a C type
    read_only: frozenset[str]  # buffers the op writes that this function only reads ("part<")
    geometry: Callable  # symbols -> (grid, block); may add symbols the kernel takes (gru_scan's S)


@dataclass(frozen=True)
class KernelSpec:
    name: str
    bufs: tuple[Buf, ...]
    consts: tuple[tuple[str, str], ...]  # (name, i32 | u32 | f32)
    derive: tuple[tuple[str, str], ...]  # (symbol, expression) computed after binding
    require: tuple[str, ...]  # expressions that must hold
    cuda: tuple[CudaFn, ...]

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.bufs)

    @property
    def writes(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.bufs if "w" in b.access)

    @property
    def inplace(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.bufs if b.access == "rw")

    def buf(self, name: str) -> Buf:
        return next(b for b in self.bufs if b.name == name)

    # ---- checks -------------------------------------------------------------------------------
    def bind(self, arrays, consts: dict, contiguity: bool = True) -> dict[str, int]:
        """Check dtypes, shapes (and, for CUDA, contiguity) of the op's arrays; return the symbols."""
        if len(arrays) != len(self.bufs):
            raise ValueError(f"{self.name}: expected {len(self.bufs)} buffers {self.params}, got {len(arrays)}")
        sym: dict[str, int] = {k: v for k, v in consts.items()}
        env = {n: globals()[n] for n in CUDA_CONSTANTS}
        for b, a in zip(self.bufs, arrays):
            if a.dtype != NP_TYPES[b.dtype]:
                raise ValueError(f"{self.name}: {b.name} must be {np.dtype(NP_TYPES[b.dtype]).name}, got {a.dtype}")
            if a.ndim != len(b.dims):
                raise ValueError(f"{self.name} shapes: {b.name} must be [{', '.join(b.dims)}], got {a.shape}")
            for dim, size in zip(b.dims, a.shape):
                if dim.isidentifier() and dim not in env and dim not in sym:
                    sym[dim] = int(size)
        for s, expr in self.derive:
            sym[s] = eval(expr, {}, {**env, **sym})  # noqa: S307 - expressions of this table only
        scope = {**env, **sym}
        for b, a in zip(self.bufs, arrays):
            want = tuple(eval(dim, {}, scope) for dim in b.dims)  # noqa: S307
            if tuple(a.shape) != want:
                detail = ", ".join(f"{d}={w}" for d, w in zip(b.dims, want))
                raise ValueError(f"{self.name} shapes: {b.name} must be [{detail}], got {a.shape}")
            if contiguity and not _contiguous(a, skip_rows=b.batched):
                raise ValueError(f"{self.name}: {b.name} must be contiguous" + (" within a row" if b.batched else ""))
        for cond in self.require:
            if not eval(cond, {}, scope):  # noqa: S307
                raise ValueError(f"{self.name}: requires {cond} ({_show(cond, scope)})")
        return sym

    # ---- CUDA --------------------------------------------------------------------------------
    def c_signature(self, fn: CudaFn) -> list[tuple[str, str]]:
        """[(C type, name)] of fn's parameters, e.g. ("const float*", "x"), ("i64", "x_rs")."""
        consts = dict(self.consts)
        out = []
        for tok in fn.args:
            name, _, ctype = tok.partition(":")
            if name in self.params:
                b = self.buf(name)
                const = "w" not in b.access or name in fn.read_only
                out.append((("const " if const else "") + C_TYPES[b.dtype] + "*", name))
            elif name.endswith("_rs") and name[:-3] in self.params:
                out.append(("i64", name))
            elif name in consts:
                out.append((C_TYPES[consts[name]], name))
            else:
                out.append((C_TYPES[ctype or "i32"], name))
        return out

    def cuda_args(self, fn: CudaFn, arrays: dict, sym: dict) -> tuple:
        consts = dict(self.consts)
        out = []
        for tok in fn.args:
            name, _, ctype = tok.partition(":")
            if name in arrays:
                out.append(arrays[name])
            elif name.endswith("_rs") and name[:-3] in arrays:
                a = arrays[name[:-3]]
                out.append(np.int64(a.strides[0] // a.itemsize))
            else:
                t = consts.get(name) or ctype or "i32"
                v = sym[name]
                out.append(NP_TYPES[t](v & 0xFFFFFFFF if t == "u32" else v))
        return tuple(out)


def _contiguous(a, skip_rows: bool) -> bool:
    expect = a.itemsize
    for n, st in reversed(list(zip(a.shape, a.strides))[1 if skip_rows else 0:]):
        if n > 1 and st != expect:
            return False
        expect *= n
    return True


def _show(cond: str, scope: dict) -> str:
    names = sorted({t for t in cond.replace("(", " ").replace(")", " ").split() if t in scope})
    return ", ".join(f"{n}={scope[n]}" for n in names)


def _parse_bufs(text: str) -> tuple[Buf, ...]:
    out = []
    for tok in text.split():
        head, _, access = tok.partition("]")
        name, _, rest = head.partition(":")
        dtype, _, dims = rest.partition("[")
        out.append(Buf(name, dtype, tuple(d for d in dims.split(",")), access.lstrip(":") or "r"))
    return tuple(out)


SPECS: dict[str, KernelSpec] = {}


def spec(name: str, bufs: str, *cuda: tuple[str, str, str, Callable], consts: str = "", derive: str = "",
         require: tuple[str, ...] = ()) -> None:
    fns = []
    for source, fn, args, geometry in cuda:
        toks = args.split()
        fns.append(CudaFn(source, fn, tuple(t.rstrip("<") for t in toks),
                          frozenset(t[:-1] for t in toks if t.endswith("<")), geometry))
    SPECS[name] = KernelSpec(
        name, _parse_bufs(bufs), tuple(tuple(c.split(":")) for c in consts.split()),
        tuple(tuple(d.split("=", 1)) for d in derive.split()), tuple(require), tuple(fns))


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def flat(n: int, threads: int = 128) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """One thread per item."""
    return (max(1, _cdiv(n, threads)), 1, 1), (threads, 1, 1)


def items(expr: str, threads: int = 128) -> Callable:
    """Geometry: one thread per item, expr items (a warp per item: expr * 32)."""
    return lambda s: flat(eval(expr, {}, s), threads)  # noqa: S307 - expressions of this table only


def blocks(grid: str, threads: str | int) -> Callable:
    """Geometry: grid = (expr, ...) blocks of `threads` threads."""
    def geometry(s):
        g = tuple(eval(grid, {}, s)) if "," in grid else (eval(grid, {}, s),)  # noqa: S307
        t = threads if isinstance(threads, int) else eval(threads, {"max": max, "cdiv": _cdiv}, s)  # noqa: S307
        return g + (1,) * (3 - len(g)), (t, 1, 1)
    return geometry


def _gru_scan_geometry(s: dict):
    """S lanes per hidden unit: the largest power of two <= 32 with H * S <= GRU_SCAN_MAX_H threads."""
    S = 1
    while S < 32 and 2 * S * s["H"] <= GRU_SCAN_MAX_H:
        S *= 2
    s["S"] = S
    return (1, 1, 1), (_cdiv(s["H"] * S, 32) * 32, 1, 1)


# Access after "]": r (default), :w written, :rw read and written. In a CUDA argument list "buf<" marks a
# buffer the op writes but that function only reads. Each CUDA function ends with its launch geometry.
spec("obs_norm", "obs:f32[B,n] mean:f32[n] inv_std:f32[n] x:f32[B,n]:w",
     ("dense.cu", "obs_norm_f32", "obs obs_rs mean inv_std x x_rs B n", items("B * n")))
spec("linear", "x:f32[B,n_in] w:f32[n_in,n_out] bias:f32[n_out] y:f32[B,n_out]:w tmp:f32[B,n_out]:w",
     ("dense.cu", "linear_f32", "x x_rs w bias y y_rs B n_in n_out act", items("B * n_out * 32")),  # warp/output
     consts="act:i32")
spec("add", "x:f32[B,n]:rw y:f32[B,n]", ("dense.cu", "add_f32", "x x_rs y y_rs B n", items("B * n")))
spec("rmsnorm", "x:f32[B,n] g:f32[n] y:f32[B,n]:w ms:f32[B,1,1]:w",
     ("dense.cu", "rmsnorm_f32", "x x_rs g y y_rs B n", blocks("B", 32)))
spec("causal_conv", "x:f32[B,d]:rw conv_state:f32[B,k-1,d]:rw w:f32[k,d] bias:f32[d] out:f32[B,d]:w tmp:f32[B,d]:w",
     ("recurrent.cu", "causal_conv_f32", "x x_rs conv_state conv_state_rs w bias out out_rs B d k", items("B * d")),
     derive="km1=k-1", require=("k >= 2",))
spec("gru_cell", "x:f32[B,n_in] h:f32[B,H] w_ih:f32[n_in,3*H] w_hh:f32[H,3*H] b_ih:f32[3*H] b_hh:f32[3*H] "
     "gi:f32[B,3*H]:w gh:f32[B,3*H]:w h_new:f32[B,H]:w",
     ("recurrent.cu", "gru_cell_f32", "x x_rs h h_rs w_ih w_hh b_ih b_hh h_new h_new_rs B n_in H",
      items("B * H * 32")))  # a warp per hidden unit
spec("gru_commit", "h:f32[B,H]:w h_new:f32[B,H] x:f32[B,H]:rw",
     ("recurrent.cu", "gru_commit_f32", "h h_rs h_new h_new_rs x x_rs B H", items("B * H")))
# the whole-sequence GRU of cold prefill (no plan op): one persistent block, S lanes per hidden unit
spec("gru_scan", "gi:f32[n,3*H] w_hh:f32[H,3*H] b_hh:f32[3*H] hs:f32[n,H]:w",
     ("recurrent.cu", "gru_scan_f32", "gi w_hh b_hh hs n H S", _gru_scan_geometry),
     require=("1 <= H <= GRU_SCAN_MAX_H",))
# the selective SSM mixer: one step (after the linear that makes proj), and the whole sequence for prefill
spec("ssm_step", "x:f32[B,d]:rw xn:f32[B,d] h:f32[B,d,N]:rw proj:f32[B,d+2*N] a_log:f32[d,N] d_skip:f32[d] "
     "dt:f32[B,d]:w u:f32[B,d]:w decay:f32[B,d,N]:w dbx:f32[B,d,N]:w y:f32[B,d]:w",
     ("ssm.cu", "ssm_step_f32", "x x_rs xn xn_rs h h_rs proj proj_rs a_log d_skip B d N", items("B * d")),
     require=("1 <= N <= SSM_MAX_N",))
spec("ssm_scan", "proj:f32[n,d+2*N] xn:f32[n,d] a_log:f32[d,N] d_skip:f32[d] h:f32[d,N]:w y:f32[n,d]:w",
     ("ssm.cu", "ssm_scan_f32", "proj xn a_log d_skip h y n d N", items("d", 32)), require=("1 <= N <= SSM_MAX_N",))
_LOG = ("qkv:f32[B,3*d] k_log:f32[n_pages,KV_PAGE,d]{a} v_log:f32[n_pages,KV_PAGE,d]{a} meta:i64[B,META_LEN] "
        "kv_pages:i64[B,P]")
spec("kv_write", _LOG.format(a=":w"),
     ("attention.cu", "kv_write_f32", "qkv qkv_rs k_log v_log n_pages:i64 meta meta_rs kv_pages kv_pages_rs P B d",
      items("B * d")))
spec("attn_decode", _LOG.format(a="") + " out:f32[B,d]:w scores:f32[B,n_heads,P,1,KV_PAGE]:w "
     "chunk_m:f32[B,n_heads,P,1,1]:w chunk_l:f32[B,n_heads,P,1,1]:w chunk_acc:f32[B,n_heads,P,hd]:w "
     "attn_max:f32[B,n_heads,1,1]:w attn_den:f32[B,n_heads,1,1]:w part:f32[B,n_heads,P,hd+2]:w ones:f32[KV_PAGE,1]",
     ("attention.cu", "attn_partial_f32", "qkv qkv_rs k_log v_log n_pages:i64 meta meta_rs kv_pages kv_pages_rs "
      "scores scores_rs part part_rs B kv_window d n_heads", blocks("B * n_heads, P", ATTN_THREADS)),
     ("attention.cu", "attn_combine_f32", "part< part_rs out out_rs B d n_heads P",
      blocks("B * n_heads", "max(32, cdiv(hd, 32) * 32)")),
     consts="n_heads:i32 kv_window:i32", derive="hd=d//n_heads",
     require=("d % n_heads == 0", "hd <= ATTN_MAX_HD", "P * KV_PAGE >= kv_window + KV_PAGE"))
# the chunk blend, then the robot's units: action = blend * scale + offset
spec("temporal_ensemble", "chunk:f32[B,K*A] mtp_state:f32[B,K,K*A]:rw meta:i64[B,META_LEN] scale:f32[A] "
     "offset:f32[A] action:f32[B,A]:w tmp:f32[B,A]:w",
     ("head.cu", "temporal_ensemble_f32", "chunk chunk_rs mtp_state mtp_state_rs meta meta_rs scale offset action "
      "action_rs B K A decay", blocks("B", 64)),
     consts="decay:f32")
spec("rng_noise", "action:f32[B,A]:rw meta:i64[B,META_LEN]",
     ("head.cu", "rng_noise_f32", "action action_rs meta meta_rs B A seed std", items("B * A", 64)),
     consts="seed:u32 std:f32")
spec("meta_advance", "meta:i64[B,META_LEN]:rw",
     ("head.cu", "meta_advance_i64", "meta meta_rs B kv_window", items("B", 32)), consts="kv_window:i32")
