"""The hybrid policy: its buffer table and its step plan, both walked from the one network description
in model/network.py (DESIGN.md, "The default policy").

obs -> normalise -> in_proj -> n_layers x [conv, GRU, attention, MLP] -> chunk head
    -> temporal ensemble -> (noise) -> action; meta advances last.
"""
from __future__ import annotations

from .buffers import SMALL_ROLES, BufferSpec
from .config import PolicyConfig
from .network import INPUTS, OUTPUTS, block, walk
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
        io = [
            BufferSpec("obs", (c.obs_dim,), F32, "io"),
            BufferSpec("action", (c.action_dim,), F32, "io"),
            BufferSpec("chunk", (c.chunk_len * c.action_dim,), F32, "io"),  # chunk_len x action_dim, row-major
        ]
        scratch: dict[str, tuple[int, ...]] = {}
        for op, _ in walk(c):  # each op's work buffers, in network order; ops that share one agree on its shape
            for name, shape in op.scratch(c):
                if scratch.setdefault(name, shape) != shape:
                    raise ValueError(f"scratch {name}: {type(op).__name__} wants {shape}, another op {scratch[name]}")
        return io + [BufferSpec(n, s, F32, "scratch") for n, s in scratch.items()]

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
