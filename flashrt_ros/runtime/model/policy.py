"""The hybrid policy: its buffer table and its step plan, both walked from the one network description
in model/network.py (DESIGN.md, "The default policy").

obs -> normalise -> in_proj -> n_layers x [conv, GRU, attention, MLP] -> chunk head
    -> temporal ensemble -> (noise) -> action; meta advances last.
"""
from __future__ import annotations

from .buffers import SMALL_ROLES, BufferSpec
from .config import PolicyConfig
from .kernels import KV_PAGE, window_pages
from .network import INPUTS, MLP_RATIO, OUTPUTS, block, walk
from .plan import GraphPlan

F32 = "float32"


class HybridPolicy:
    def __init__(self, cfg: PolicyConfig, kv_log_pages: int = 1):
        self.cfg = cfg
        self.kv_log_pages = kv_log_pages  # pages of KV_PAGE entries in the log (sized by the store)

    # ---- buffer table ---------------------------------------------------------------------
    def _layer_state(self, layer: int) -> list[BufferSpec]:
        """A layer's small state in role order (recurrent before conv), whatever the op order."""
        specs = [s for op in block(self.cfg) for s in op.state(self.cfg, layer)]
        return sorted(specs, key=lambda s: SMALL_ROLES.index(s.role))

    def state_specs(self) -> list[BufferSpec]:
        """The small state of one row: what a snapshot copies."""
        specs = [s for layer in range(self.cfg.n_layers) for s in self._layer_state(layer)]
        return specs + [s for op in INPUTS + OUTPUTS for s in op.state(self.cfg, None)]

    def log_specs(self) -> list[BufferSpec]:
        """The KV log, shared by every row and capsule (+ the sink page that unused page-table slots point at)."""
        return [s for op, layer in walk(self.cfg) for s in op.log(self.cfg, layer, self.kv_log_pages + 1)]

    def window_specs(self) -> list[BufferSpec]:
        """The materialised state (capsule files, the full-copy oracle): the KV window gathered as
        [kv_window, d] (slot = position % kv_window) beside the small state, page table excluded."""
        specs = []
        for layer in range(self.cfg.n_layers):
            specs += [s for op in block(self.cfg) for s in op.window(self.cfg, layer)] + self._layer_state(layer)
        return specs + [s for op in INPUTS + OUTPUTS for s in op.state(self.cfg, None) if s.name != "kv_pages"]

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
        names = {n for n, _ in scratch}
        for op, _ in walk(c):  # an op's own work buffers, after the shared ones
            scratch += [(n, s) for n, s in op.scratch(c) if n not in names and not names.add(n)]
        return io + [BufferSpec(n, s, F32, "scratch") for n, s in scratch]

    def weight_specs(self) -> list[BufferSpec]:
        """Every op's weights in network order, then the constants shared by all layers."""
        w = [x for op, layer in walk(self.cfg) for x in op.weights(self.cfg, layer)]
        shared = {}
        for op, _ in walk(self.cfg):
            shared.update(dict.fromkeys(op.shared_weights(self.cfg)))
        return [BufferSpec(n, s, F32, "weight") for n, s in w + list(shared)]

    def buffer_specs(self) -> list[BufferSpec]:
        return self.state_specs() + self.log_specs() + self.work_specs() + self.weight_specs()

    # ---- plan -----------------------------------------------------------------------------
    def build_plan(self) -> GraphPlan:
        """The step plan: every op's step form in network order (the live step and the replan batch)."""
        plan = GraphPlan()
        for op, layer in walk(self.cfg):
            op.step(plan, self.cfg, layer)
        return plan
