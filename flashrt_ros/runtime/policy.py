"""The hybrid policy: its buffer table and its step plan (DESIGN.md, "The default policy").

obs -> normalise -> in_proj -> n_layers x [conv, GRU, attention, MLP] -> chunk head
    -> temporal ensemble -> (noise) -> action; meta advances last.
"""
from __future__ import annotations

from .buffers import BufferSpec
from .config import PolicyConfig
from .kernels import ACT_NONE, ACT_SILU, ACT_TANH, KV_PAGE, META_LEN, window_pages
from .plan import GraphPlan

MLP_RATIO = 2
F32, I64 = "float32", "int64"


class HybridPolicy:
    def __init__(self, cfg: PolicyConfig, kv_log_pages: int = 1):
        self.cfg = cfg
        self.kv_log_pages = kv_log_pages  # pages of KV_PAGE entries in the log (sized by the store)

    # ---- buffer table ---------------------------------------------------------------------
    def state_specs(self) -> list[BufferSpec]:
        """The small state of one row: what a snapshot copies."""
        c = self.cfg
        d, K, A = c.d_model, c.chunk_len, c.action_dim
        specs = []
        for layer in range(c.n_layers):
            specs += [
                BufferSpec(f"recurrent_state.{layer}", (d,), F32, "recurrent"),  # GRU hidden
                BufferSpec(f"conv_state.{layer}", (c.conv_kernel - 1, d), F32, "conv"),  # oldest first
            ]
        specs += [
            BufferSpec("mtp_state", (K, K * A), F32, "mtp"),  # ring of the last K chunks
            BufferSpec("meta", (META_LEN,), I64, "meta"),  # step, position, kv_len, rng_counter
            # [P]: log page of window chunk c at index c % P (P = window_pages); read by the kernels
            BufferSpec("kv_pages", (window_pages(c.kv_window),), I64, "meta"),
        ]
        return specs

    def log_specs(self) -> list[BufferSpec]:
        """The KV log, shared by every row and capsule: entry of position t at (page, t % KV_PAGE)."""
        c = self.cfg
        pages = self.kv_log_pages + 1  # + the sink page that unused page-table slots point at
        return [BufferSpec(f"{kv}_log.{layer}", (pages, KV_PAGE, c.d_model), F32, "kv")
                for layer in range(c.n_layers) for kv in ("k", "v")]  # [pages, KV_PAGE, d]

    def window_specs(self) -> list[BufferSpec]:
        """The materialised state (capsule files, the full-copy oracle): the KV window gathered as
        [kv_window, d] (slot = position % kv_window) beside the small state, page table excluded."""
        c = self.cfg
        specs = []
        small = {s.name: s for s in self.state_specs()}
        for layer in range(c.n_layers):
            specs += [BufferSpec(f"k_cache.{layer}", (c.kv_window, c.d_model), F32, "kv"),
                      BufferSpec(f"v_cache.{layer}", (c.kv_window, c.d_model), F32, "kv"),
                      small[f"recurrent_state.{layer}"], small[f"conv_state.{layer}"]]
        return specs + [small["mtp_state"], small["meta"]]

    def work_specs(self) -> list[BufferSpec]:
        c = self.cfg
        d, K, A, H = c.d_model, c.chunk_len, c.action_dim, c.n_heads
        P, hd = window_pages(c.kv_window), c.d_model // c.n_heads
        io = [
            BufferSpec("obs", (c.obs_dim,), F32, "io"),
            BufferSpec("action", (A,), F32, "io"),
            BufferSpec("chunk", (K * A,), F32, "io"),  # chunk_len x action_dim, row-major
        ]
        scratch = [
            ("obs_n", (c.obs_dim,)), ("x", (d,)), ("xn", (d,)), ("tmp_d", (d,)), ("conv_out", (d,)),
            ("gi", (3 * d,)), ("gh", (3 * d,)), ("h_new", (d,)), ("qkv", (3 * d,)), ("qkv_tmp", (3 * d,)),
            ("attn", (d,)), ("proj", (d,)), ("mlp_h", (MLP_RATIO * d,)), ("mlp_tmp", (MLP_RATIO * d,)),
            ("chunk_tmp", (K * A,)), ("act_tmp", (A,)), ("ms", (1, 1)),
            # attention over the window, one chunk per page slot (NumPy twin); CUDA uses attn_part
            ("scores", (H, P, 1, KV_PAGE)), ("chunk_m", (H, P, 1, 1)), ("chunk_l", (H, P, 1, 1)),
            ("chunk_acc", (H, P, hd)), ("attn_max", (H, 1, 1)), ("attn_den", (H, 1, 1)),
            ("attn_part", (H, P, hd + 2)),  # CUDA split-K partials: (acc..., m, l) per chunk
        ]
        return io + [BufferSpec(n, s, F32, "scratch") for n, s in scratch]

    def weight_specs(self) -> list[BufferSpec]:
        c = self.cfg
        d, K, A = c.d_model, c.chunk_len, c.action_dim
        m = MLP_RATIO * d
        w = [("obs_mean", (c.obs_dim,)), ("obs_inv_std", (c.obs_dim,)),
             ("in_proj.w", (c.obs_dim, d)), ("in_proj.b", (d,))]
        for layer in range(c.n_layers):
            p = f"layers.{layer}."
            w += [(p + "conv.w", (c.conv_kernel, d)), (p + "conv.b", (d,)),
                  (p + "gru.w_ih", (d, 3 * d)), (p + "gru.w_hh", (d, 3 * d)),
                  (p + "gru.b_ih", (3 * d,)), (p + "gru.b_hh", (3 * d,)),
                  (p + "attn_norm.g", (d,)), (p + "qkv.w", (d, 3 * d)), (p + "qkv.b", (3 * d,)),
                  (p + "out.w", (d, d)), (p + "out.b", (d,)),
                  (p + "mlp_norm.g", (d,)), (p + "mlp.w1", (d, m)), (p + "mlp.b1", (m,)),
                  (p + "mlp.w2", (m, d)), (p + "mlp.b2", (d,))]
        w += [("head_norm.g", (d,)), ("head.w", (d, K * A)), ("head.b", (K * A,)),
              ("const.ones", (KV_PAGE, 1))]  # constant: per-chunk softmax denominators as a GEMV
        return [BufferSpec(n, s, F32, "weight") for n, s in w]

    def buffer_specs(self) -> list[BufferSpec]:
        return self.state_specs() + self.log_specs() + self.work_specs() + self.weight_specs()

    # ---- plan -----------------------------------------------------------------------------
    def build_plan(self) -> GraphPlan:
        c = self.cfg
        plan = GraphPlan()
        plan.add("obs_norm", "obs", "obs_mean", "obs_inv_std", "obs_n")
        plan.add("linear", "obs_n", "in_proj.w", "in_proj.b", "x", "tmp_d", act=ACT_NONE, label="in_proj")
        for layer in range(c.n_layers):
            p = f"layers.{layer}."
            k, v = f"k_log.{layer}", f"v_log.{layer}"
            plan.add("causal_conv", "x", f"conv_state.{layer}", p + "conv.w", p + "conv.b", "conv_out", "tmp_d",
                     label=f"L{layer}.conv")
            plan.add("gru_cell", "x", f"recurrent_state.{layer}", p + "gru.w_ih", p + "gru.w_hh", p + "gru.b_ih",
                     p + "gru.b_hh", "gi", "gh", "h_new", label=f"L{layer}.gru")
            plan.add("gru_commit", f"recurrent_state.{layer}", "h_new", "x", label=f"L{layer}.gru_commit")
            plan.add("rmsnorm", "x", p + "attn_norm.g", "xn", "ms", label=f"L{layer}.attn_norm")
            plan.add("linear", "xn", p + "qkv.w", p + "qkv.b", "qkv", "qkv_tmp", act=ACT_NONE, label=f"L{layer}.qkv")
            plan.add("kv_write", "qkv", k, v, "meta", "kv_pages", label=f"L{layer}.kv_write")
            plan.add("attn_decode", "qkv", k, v, "meta", "kv_pages", "attn", "scores", "chunk_m", "chunk_l",
                     "chunk_acc", "attn_max", "attn_den", "attn_part", "const.ones", n_heads=c.n_heads,
                     kv_window=c.kv_window, label=f"L{layer}.attn")
            plan.add("linear", "attn", p + "out.w", p + "out.b", "proj", "tmp_d", act=ACT_NONE, label=f"L{layer}.out")
            plan.add("add", "x", "proj", label=f"L{layer}.attn_residual")
            plan.add("rmsnorm", "x", p + "mlp_norm.g", "xn", "ms", label=f"L{layer}.mlp_norm")
            plan.add("linear", "xn", p + "mlp.w1", p + "mlp.b1", "mlp_h", "mlp_tmp", act=ACT_SILU,
                     label=f"L{layer}.mlp_up")
            plan.add("linear", "mlp_h", p + "mlp.w2", p + "mlp.b2", "proj", "tmp_d", act=ACT_NONE,
                     label=f"L{layer}.mlp_down")
            plan.add("add", "x", "proj", label=f"L{layer}.mlp_residual")
        plan.add("rmsnorm", "x", "head_norm.g", "xn", "ms", label="head_norm")
        plan.add("linear", "xn", "head.w", "head.b", "chunk", "chunk_tmp", act=ACT_TANH, label="chunk_head")
        plan.add("temporal_ensemble", "chunk", "mtp_state", "meta", "action", "act_tmp")
        if c.action_noise_std > 0:
            plan.add("rng_noise", "action", "meta", seed=c.seed, std=c.action_noise_std)
        plan.add("meta_advance", "meta", kv_window=c.kv_window)
        return plan
