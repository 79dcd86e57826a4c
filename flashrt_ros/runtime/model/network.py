"""The network, described once: the hybrid policy as input ops, one list of ops per layer, and output ops.

Each op declares its buffers (small state, KV log, weights, scratch) and carries both forms of its math side
by side:

  step(plan, cfg, layer)      the per-step form: kernel ops of the plan (kernels.py twins on NumPy, the numba
                              kernels of engine/cpu_registry.py on the compiled CPU step, kernels/*.cu on CUDA).
                              The live step and the batched replan bind this plan.
  sequence(seq, x, layer)     the sequence form over all n steps at once (sequence.py), for cold prefill;
                              it writes the op's state into the live row and returns the new x.

policy.py builds the buffer table and the step plan by walking MODEL; prefill.py walks the same list. The
config's mixer choices are the keys of MIXERS.
``meta`` advances in one op (MetaAdvance), through one function (kernels.advance_meta).
"""
from __future__ import annotations

import numpy as np

from .buffers import BufferSpec
from .kernels import ACT_NONE, ACT_SILU, ACT_TANH, KV_PAGE, META_LEN, advance_meta, ssm_scan_ref, window_pages
from .sequence import gru_scan, rmsnorm, silu, windowed_attention

MLP_RATIO = 2
SSM_STATE = 8  # states per channel of the SSM mixer: ssm_state is [d_model, SSM_STATE]
F32, I64 = "float32", "int64"


class Op:
    """Defaults: no state, no weights; subclasses override what they have."""

    def state(self, cfg, layer) -> list[BufferSpec]:  # per-row small state (what a snapshot copies)
        return []

    def log(self, cfg, layer, pages: int) -> list[BufferSpec]:  # KV log buffers (shared by rows and capsules)
        return []

    def window(self, cfg, layer) -> list[BufferSpec]:  # the KV window materialised (files, the oracle)
        return []

    def weights(self, cfg, layer) -> list[tuple[str, tuple[int, ...]]]:
        return []

    def shared_weights(self, cfg) -> list[tuple[str, tuple[int, ...]]]:  # once for all layers
        return []

    def scratch(self, cfg) -> list[tuple[str, tuple[int, ...]]]:  # per-row float32 work buffers its step uses
        return []  # ops share a name (one buffer, one shape)


# ---- input ---------------------------------------------------------------------------------------
class Input(Op):
    """obs -> normalise -> in_proj."""

    def weights(self, cfg, layer):
        return [("obs_mean", (cfg.obs_dim,)), ("obs_inv_std", (cfg.obs_dim,)),
                ("in_proj.w", (cfg.obs_dim, cfg.d_model)), ("in_proj.b", (cfg.d_model,))]

    def scratch(self, cfg):
        return [("obs_n", (cfg.obs_dim,)), ("x", (cfg.d_model,)), ("tmp_d", (cfg.d_model,))]  # x: the residual

    def step(self, plan, cfg, layer):
        plan.add("obs_norm", "obs", "obs_mean", "obs_inv_std", "obs_n")
        plan.add("linear", "obs_n", "in_proj.w", "in_proj.b", "x", "tmp_d", act=ACT_NONE, label="in_proj")

    def sequence(self, seq, obs, layer):
        w, xp = seq.w, seq.xp
        o = xp.asarray(obs, dtype=xp.float32)
        return ((o - w("obs_mean")) * w("obs_inv_std")) @ w("in_proj.w") + w("in_proj.b")  # [n, d]


# ---- the block: one list of ops per layer --------------------------------------------------------
class CausalConv(Op):
    """x += silu(depthwise causal conv over the last conv_kernel inputs); conv_state keeps k-1 inputs."""

    def state(self, cfg, layer):
        return [BufferSpec(f"conv_state.{layer}", (cfg.conv_kernel - 1, cfg.d_model), F32, "conv")]  # oldest first

    def weights(self, cfg, layer):
        p = f"layers.{layer}."
        return [(p + "conv.w", (cfg.conv_kernel, cfg.d_model)), (p + "conv.b", (cfg.d_model,))]

    def scratch(self, cfg):
        return [("conv_out", (cfg.d_model,)), ("tmp_d", (cfg.d_model,))]

    def step(self, plan, cfg, layer):
        p = f"layers.{layer}."
        plan.add("causal_conv", "x", f"conv_state.{layer}", p + "conv.w", p + "conv.b", "conv_out", "tmp_d",
                 label=f"L{layer}.conv")

    def sequence(self, seq, x, layer):
        xp, n, p = seq.xp, seq.n, f"layers.{layer}."
        d, km1 = seq.cfg.d_model, seq.cfg.conv_kernel - 1
        padded = xp.concatenate([xp.zeros((km1, d), xp.float32), x])  # [n+k-1, d]
        cw = seq.w(p + "conv.w")
        conv = padded[km1:] * cw[km1] + seq.w(p + "conv.b")
        for j in range(km1):
            conv += padded[j:j + n] * cw[j]
        seq.live(f"conv_state.{layer}")[...] = padded[n:n + km1]
        return x + silu(xp, conv)


class Gru(Op):
    """x += h, h = GRU(x, h) (PyTorch gate order r, z, n); recurrent_state is h. Sequence form: input gates
    by one GEMM, then the scan (only h @ W_hh is sequential)."""

    def state(self, cfg, layer):
        return [BufferSpec(f"recurrent_state.{layer}", (cfg.d_model,), F32, "recurrent",
                           bound=1.0)]  # a convex mix of tanh outputs

    def weights(self, cfg, layer):
        p, d = f"layers.{layer}.", cfg.d_model
        return [(p + "gru.w_ih", (d, 3 * d)), (p + "gru.w_hh", (d, 3 * d)), (p + "gru.b_ih", (3 * d,)),
                (p + "gru.b_hh", (3 * d,))]

    def scratch(self, cfg):
        d = cfg.d_model
        return [("gi", (3 * d,)), ("gh", (3 * d,)), ("h_new", (d,))]

    def step(self, plan, cfg, layer):
        p, h = f"layers.{layer}.", f"recurrent_state.{layer}"
        plan.add("gru_cell", "x", h, p + "gru.w_ih", p + "gru.w_hh", p + "gru.b_ih", p + "gru.b_hh", "gi", "gh",
                 "h_new", label=f"L{layer}.gru")
        plan.add("gru_commit", h, "h_new", "x", label=f"L{layer}.gru_commit")

    def sequence(self, seq, x, layer):
        p = f"layers.{layer}."
        gi = x @ seq.w(p + "gru.w_ih") + seq.w(p + "gru.b_ih")  # [n, 3d]
        hs = gru_scan(seq.backend, gi, seq.w(p + "gru.w_hh"), seq.w(p + "gru.b_hh"))  # [n, d]
        seq.live(f"recurrent_state.{layer}")[...] = hs[-1]
        return x + hs


class Ssm(Op):
    """x += y, a diagonal selective state-space mixer (Mamba-style): xn = rmsnorm(x), proj = xn W_in + b_in
    gives the input-dependent step dt (softplus), B and C; h = exp(-dt exp(a_log)) h + dt xn B,
    y = h C + d_skip xn.
    ssm_state is h [d, N]. Sequence form: proj by one GEMM, then the scan (kernels/ssm.cu, or its twin)."""

    def state(self, cfg, layer):
        return [BufferSpec(f"ssm_state.{layer}", (cfg.d_model, SSM_STATE), F32, "recurrent")]

    def weights(self, cfg, layer):
        p, d, P = f"layers.{layer}.", cfg.d_model, cfg.d_model + 2 * SSM_STATE
        return [(p + "ssm_norm.g", (d,)), (p + "ssm.in.w", (d, P)), (p + "ssm.in.b", (P,)),
                (p + "ssm.a_log", (d, SSM_STATE)), (p + "ssm.d", (d,))]

    def scratch(self, cfg):
        d, P = cfg.d_model, cfg.d_model + 2 * SSM_STATE
        return [("xn", (d,)), ("ms", (1, 1)), ("ssm_proj", (P,)), ("ssm_proj_tmp", (P,)), ("ssm_dt", (d,)),
                ("ssm_u", (d,)), ("ssm_decay", (d, SSM_STATE)), ("ssm_dbx", (d, SSM_STATE)), ("ssm_y", (d,))]

    def step(self, plan, cfg, layer):
        p = f"layers.{layer}."
        plan.add("rmsnorm", "x", p + "ssm_norm.g", "xn", "ms", label=f"L{layer}.ssm_norm")
        plan.add("linear", "xn", p + "ssm.in.w", p + "ssm.in.b", "ssm_proj", "ssm_proj_tmp", act=ACT_NONE,
                 label=f"L{layer}.ssm_in")
        plan.add("ssm_step", "x", "xn", f"ssm_state.{layer}", "ssm_proj", p + "ssm.a_log", p + "ssm.d", "ssm_dt",
                 "ssm_u", "ssm_decay", "ssm_dbx", "ssm_y", label=f"L{layer}.ssm")

    def sequence(self, seq, x, layer):
        xp, p, w = seq.xp, f"layers.{layer}.", seq.w
        xn = xp.ascontiguousarray(rmsnorm(xp, x, w(p + "ssm_norm.g")))
        proj = xp.ascontiguousarray(xn @ w(p + "ssm.in.w") + w(p + "ssm.in.b"))  # [n, d + 2N]
        h = xp.empty((seq.cfg.d_model, SSM_STATE), xp.float32)
        y = xp.empty(x.shape, xp.float32)
        args = (proj, xn, w(p + "ssm.a_log"), w(p + "ssm.d"), h, y)
        if hasattr(seq.backend, "launch"):
            seq.backend.launch("ssm_scan", *args)
        else:
            ssm_scan_ref(*args)
        seq.live(f"ssm_state.{layer}")[...] = h
        return x + y


class Attention(Op):
    """x += out(attention(rmsnorm(x)) over the KV window); this step's k, v are appended to the KV log."""

    def log(self, cfg, layer, pages):  # [pages, KV_PAGE, d]: entry of position t at (page, t % KV_PAGE)
        return [BufferSpec(f"{kv}_log.{layer}", (pages, KV_PAGE, cfg.d_model), F32, "kv") for kv in ("k", "v")]

    def window(self, cfg, layer):  # [kv_window, d], slot = position % kv_window
        return [BufferSpec(f"{kv}_cache.{layer}", (cfg.kv_window, cfg.d_model), F32, "kv") for kv in ("k", "v")]

    def weights(self, cfg, layer):
        p, d = f"layers.{layer}.", cfg.d_model
        return [(p + "attn_norm.g", (d,)), (p + "qkv.w", (d, 3 * d)), (p + "qkv.b", (3 * d,)), (p + "out.w", (d, d)),
                (p + "out.b", (d,))]

    def shared_weights(self, cfg):
        return [("const.ones", (KV_PAGE, 1))]  # constant: per-chunk softmax denominators as a GEMV

    def scratch(self, cfg):
        d, H, P, hd = cfg.d_model, cfg.n_heads, window_pages(cfg.kv_window), cfg.d_model // cfg.n_heads
        return [("xn", (d,)), ("ms", (1, 1)), ("qkv", (3 * d,)), ("qkv_tmp", (3 * d,)), ("attn", (d,)),
                ("proj", (d,)), ("tmp_d", (d,)),
                # one chunk per page slot (NumPy twin); CUDA uses attn_part
                ("scores", (H, P, 1, KV_PAGE)), ("chunk_m", (H, P, 1, 1)), ("chunk_l", (H, P, 1, 1)),
                ("chunk_acc", (H, P, hd)), ("attn_max", (H, 1, 1)), ("attn_den", (H, 1, 1)),
                ("attn_part", (H, P, hd + 2))]  # CUDA split-K partials: (acc..., m, l) per chunk

    def step(self, plan, cfg, layer):
        p, k, v = f"layers.{layer}.", f"k_log.{layer}", f"v_log.{layer}"
        plan.add("rmsnorm", "x", p + "attn_norm.g", "xn", "ms", label=f"L{layer}.attn_norm")
        plan.add("linear", "xn", p + "qkv.w", p + "qkv.b", "qkv", "qkv_tmp", act=ACT_NONE, label=f"L{layer}.qkv")
        plan.add("kv_write", "qkv", k, v, "meta", "kv_pages", label=f"L{layer}.kv_write")
        plan.add("attn_decode", "qkv", k, v, "meta", "kv_pages", "attn", "scores", "chunk_m", "chunk_l",
                 "chunk_acc", "attn_max", "attn_den", "attn_part", "const.ones", n_heads=cfg.n_heads,
                 kv_window=cfg.kv_window, label=f"L{layer}.attn")
        plan.add("linear", "attn", p + "out.w", p + "out.b", "proj", "tmp_d", act=ACT_NONE, label=f"L{layer}.out")
        plan.add("add", "x", "proj", label=f"L{layer}.attn_residual")

    def sequence(self, seq, x, layer):
        """Windowed causal attention; after the last layer only the head's rows matter (seq.first)."""
        cfg, xp, n, p = seq.cfg, seq.xp, seq.n, f"layers.{layer}."
        d, W = cfg.d_model, cfg.kv_window
        first = seq.first(layer)
        qkv = rmsnorm(xp, x, seq.w(p + "attn_norm.g")) @ seq.w(p + "qkv.w") + seq.w(p + "qkv.b")  # [n, 3d]
        q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
        kv_first = max(0, n - W)
        slots = np.arange(kv_first, n) % W
        kw, vw = np.zeros((W, d), np.float32), np.zeros((W, d), np.float32)
        kw[slots], vw[slots] = seq.backend.to_host(k[kv_first:]), seq.backend.to_host(v[kv_first:])
        seq.windows.append((kw, vw))
        return x[first:] + windowed_attention(xp, q, k, v, cfg.n_heads, W, first) @ seq.w(p + "out.w") \
            + seq.w(p + "out.b")


class Mlp(Op):
    """x += w2 silu(w1 rmsnorm(x))."""

    def weights(self, cfg, layer):
        p, d, m = f"layers.{layer}.", cfg.d_model, MLP_RATIO * cfg.d_model
        return [(p + "mlp_norm.g", (d,)), (p + "mlp.w1", (d, m)), (p + "mlp.b1", (m,)), (p + "mlp.w2", (m, d)),
                (p + "mlp.b2", (d,))]

    def scratch(self, cfg):
        d, m = cfg.d_model, MLP_RATIO * cfg.d_model
        return [("xn", (d,)), ("ms", (1, 1)), ("mlp_h", (m,)), ("mlp_tmp", (m,)), ("proj", (d,)), ("tmp_d", (d,))]

    def step(self, plan, cfg, layer):
        p = f"layers.{layer}."
        plan.add("rmsnorm", "x", p + "mlp_norm.g", "xn", "ms", label=f"L{layer}.mlp_norm")
        plan.add("linear", "xn", p + "mlp.w1", p + "mlp.b1", "mlp_h", "mlp_tmp", act=ACT_SILU,
                 label=f"L{layer}.mlp_up")
        plan.add("linear", "mlp_h", p + "mlp.w2", p + "mlp.b2", "proj", "tmp_d", act=ACT_NONE,
                 label=f"L{layer}.mlp_down")
        plan.add("add", "x", "proj", label=f"L{layer}.mlp_residual")

    def sequence(self, seq, x, layer):
        xp, p, w = seq.xp, f"layers.{layer}.", seq.w
        hmid = silu(xp, rmsnorm(xp, x, w(p + "mlp_norm.g")) @ w(p + "mlp.w1") + w(p + "mlp.b1"))
        return x + hmid @ w(p + "mlp.w2") + w(p + "mlp.b2")


# ---- outputs -------------------------------------------------------------------------------------
class ChunkHead(Op):
    """chunk = tanh(head(rmsnorm(x))): the next chunk_len actions; mtp_state keeps the last K chunks and the
    temporal ensemble blends them into this step's action, then action = blend * action_scale + action_offset
    (the robot's units: the head's tanh alone never leaves (-1, 1))."""

    def state(self, cfg, layer):
        K = cfg.chunk_len
        return [BufferSpec("mtp_state", (K, K * cfg.action_dim), F32, "mtp", bound=1.0)]  # last K tanh chunks

    def weights(self, cfg, layer):
        KA = cfg.chunk_len * cfg.action_dim
        return [("head_norm.g", (cfg.d_model,)), ("head.w", (cfg.d_model, KA)), ("head.b", (KA,)),
                ("action_scale", (cfg.action_dim,)), ("action_offset", (cfg.action_dim,))]

    def scratch(self, cfg):
        return [("xn", (cfg.d_model,)), ("ms", (1, 1)), ("chunk_tmp", (cfg.chunk_len * cfg.action_dim,)),
                ("act_tmp", (cfg.action_dim,))]

    def step(self, plan, cfg, layer):
        plan.add("rmsnorm", "x", "head_norm.g", "xn", "ms", label="head_norm")
        plan.add("linear", "xn", "head.w", "head.b", "chunk", "chunk_tmp", act=ACT_TANH, label="chunk_head")
        plan.add("temporal_ensemble", "chunk", "mtp_state", "meta", "action_scale", "action_offset", "action",
                 "act_tmp", decay=cfg.blend_decay)

    def sequence(self, seq, x, layer):
        xp, w = seq.xp, seq.w
        chunks = xp.tanh(rmsnorm(xp, x, w("head_norm.g")) @ w("head.w") + w("head.b"))  # [<=K, K*A]
        seq.live("mtp_state")[xp.arange(seq.head_rows, seq.n) % seq.cfg.chunk_len] = chunks
        return x


class Noise(Op):
    """Optional exploration noise on the action, keyed by meta's rng_counter: no state of its own."""

    def step(self, plan, cfg, layer):
        if cfg.action_noise_std > 0:
            plan.add("rng_noise", "action", "meta", seed=cfg.seed, std=cfg.action_noise_std)

    def sequence(self, seq, x, layer):
        return x  # touches the action only, never the state


class MetaAdvance(Op):
    """The last op: step, position, kv_len and rng_counter advance (kernels.advance_meta)."""

    def state(self, cfg, layer):
        return [BufferSpec("meta", (META_LEN,), I64, "meta"),  # step, position, kv_len, rng_counter
                # [P]: log page of window chunk c at index c % P (P = window_pages); read by the kernels
                BufferSpec("kv_pages", (window_pages(cfg.kv_window),), I64, "meta")]

    def step(self, plan, cfg, layer):
        plan.add("meta_advance", "meta", kv_window=cfg.kv_window)

    def sequence(self, seq, x, layer):
        meta = np.zeros((1, META_LEN), np.int64)  # the row was reset: n steps from zero
        advance_meta(meta, seq.n, seq.cfg.kv_window)
        seq.backend.from_host(seq.live("meta"), meta[0])
        return x


MIXERS = {"gru": Gru(), "ssm": Ssm()}  # the recurrent slot of a block (config: mixer)
INPUTS = (Input(),)
OUTPUTS = (ChunkHead(), Noise(), MetaAdvance())


def block(cfg) -> tuple[Op, ...]:
    """The ops of one layer."""
    return CausalConv(), MIXERS[cfg.mixer], Attention(), Mlp()


def walk(cfg):
    """(op, layer) in network order; layer is None outside the blocks."""
    for op in INPUTS:
        yield op, None
    for layer in range(cfg.n_layers):
        for op in block(cfg):
            yield op, layer
    for op in OUTPUTS:
        yield op, None
