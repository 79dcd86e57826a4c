"""The PyTorch reference module of the hybrid policy (DESIGN.md, "Policies come from files"): train it in PyTorch,
save it as a policy file, run that file in any backend of the runtime.

Derived from the one op list (runtime/model/network.py), so the two cannot drift: ``FlashRTPolicy`` walks
``network.walk(cfg)`` and builds one torch form per op from ``TORCH_FORMS`` (op class -> form). A form takes its
weights' names and shapes from the op (``op.weights``) and its state's from ``op.state`` / ``op.window``, holds
the weights in the runtime's layout where it can ([in, out] matrices: x @ w), and carries two forms of the math:

  sequence(x, out)      all T steps at once from a zero state, parallel in time where the math allows (the
                        conv, the attention); the recurrences scan. For training.
  step(x, state, out)   one step, the exact per-step math of the kernel twins (model/kernels.py): the check
                        that the file means in the runtime what it meant here, and select_action.

Units: ``forward_sequence`` returns the tanh head's chunks (normalised action units, what a loss compares with
``normalize_actions(targets)``); ``blend``, ``step`` and ``select_action`` return actions in robot units
(temporal ensemble, then ``* action_scale + action_offset``), as the runtime publishes them.

Exploration noise (cfg.action_noise_std) is the runtime's, never the policy's: the reference is the
deterministic policy, and the Noise op is the identity here.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from flashrt_ros.runtime.model import network
from flashrt_ros.runtime.model.config import PolicyConfig
from flashrt_ros.runtime.model.kernel_spec import RMS_EPS
from flashrt_ros.runtime.model.policy import HybridPolicy
from flashrt_ros.runtime.model.policy_file import config_from_policy, read_policy, save_policy
from flashrt_ros.runtime.model.weights import CONST_PREFIX, check_weights

# Not trained: set from the data (set_normalization) and saved with the policy, as in LeRobot.
NORMALISATION = ("obs_mean", "obs_inv_std", "action_scale", "action_offset")
NORMALISATION_INIT = {"obs_mean": 0.0, "obs_inv_std": 1.0, "action_scale": 1.0, "action_offset": 0.0}
MIN_OBS_STD = 1e-6  # a flatter observation channel is constant in the data: centred, not scaled (as train/data.py)
POLICY_FILE_NAME = "policy.safetensors"  # save_pretrained / from_pretrained given a directory


def rmsnorm(x, g):
    ms = (x * x).mean(dim=-1, keepdim=True)
    return x / torch.sqrt(ms + float(RMS_EPS)) * g


def blend_weights(cfg: PolicyConfig) -> np.ndarray:
    """[K] float32: w(age) = exp(-decay * age) as the ensemble twin computes it (decay a float32 constant)."""
    decay = float(np.float32(cfg.blend_decay))
    return np.array([np.float32(np.exp(-decay * age)) for age in range(cfg.chunk_len)], np.float32)


# ---- the forms: one per op class of network.py ----------------------------------------------------------
class Form(nn.Module):
    """An op's weights (runtime names, shapes from the op) and state; subclasses give the math."""

    def __init__(self, cfg: PolicyConfig, op: network.Op, layer: int | None):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.prefix = "" if layer is None else f"layers.{layer}."
        self.weight_names: list[str] = []  # runtime names, in the op's order
        for name, shape in op.weights(cfg, layer):
            self.weight_names.append(name)
            self.add_weight(name, shape)
        # the state as the runtime's window_specs name it (the KV window as [kv_window, d], slot = pos % window)
        self.state_shapes = {s.name: s.shape for s in op.state(cfg, layer) + op.window(cfg, layer)
                             if s.role != "meta"}

    def _attr(self, name: str) -> str:  # an nn.Module attribute name cannot hold "."
        return name.removeprefix(self.prefix).replace(".", "_")

    def w(self, short: str) -> torch.Tensor:
        return getattr(self, short.replace(".", "_"))

    def add_weight(self, name: str, shape) -> None:
        if name in NORMALISATION:
            self.register_buffer(self._attr(name), torch.full(shape, NORMALISATION_INIT[name]))
        else:
            self.register_parameter(self._attr(name), nn.Parameter(self.init_weight(name, shape)))

    def init_weight(self, name: str, shape) -> torch.Tensor:
        if name.endswith(".g"):
            return torch.ones(shape)
        if len(shape) == 1:  # biases
            return torch.zeros(shape)
        return torch.randn(shape) / math.sqrt(shape[0])  # [fan_in, fan_out]; conv.w is [taps, d]

    def runtime_tensors(self) -> dict[str, torch.Tensor]:
        """name -> tensor in the runtime's layout."""
        return {name: getattr(self, self._attr(name)) for name in self.weight_names}

    @torch.no_grad()
    def load_runtime(self, weights: dict[str, np.ndarray]) -> None:
        for name, t in self.runtime_tensors().items():
            t.copy_(torch.from_numpy(weights[name]))

    def initial_state(self, batch: int, device) -> dict:
        return {name: torch.zeros((batch, *shape), device=device) for name, shape in self.state_shapes.items()}

    def sequence(self, x, out: dict):  # x [B, T, .] -> [B, T, .]
        raise NotImplementedError

    def step(self, x, state: dict, out: dict):  # x [B, .] -> [B, .]; state updated by assignment, never in place
        raise NotImplementedError


class InputForm(Form):
    def _apply(self, obs):
        return ((obs - self.w("obs_mean")) * self.w("obs_inv_std")) @ self.w("in_proj.w") + self.w("in_proj.b")

    def sequence(self, obs, out):
        return self._apply(obs)

    def step(self, obs, state, out):
        return self._apply(obs)


class CausalConvForm(Form):
    """x += silu(depthwise causal conv); conv.w [k, d] with the oldest tap at w[0] (as torch's conv1d)."""

    def sequence(self, x, out):
        km1 = self.cfg.conv_kernel - 1
        w = self.w("conv.w").t().unsqueeze(1)  # [d, 1, k]
        conv = F.conv1d(F.pad(x.transpose(1, 2), (km1, 0)), w, self.w("conv.b"), groups=self.cfg.d_model)
        return x + F.silu(conv.transpose(1, 2))

    def step(self, x, state, out):
        key, w = f"conv_state.{self.layer}", self.w("conv.w")
        past = state[key]  # [B, k-1, d], oldest first
        conv = x * w[-1] + self.w("conv.b")
        for j in range(past.shape[1]):
            conv = conv + past[:, j] * w[j]
        state[key] = torch.cat([past[:, 1:], x[:, None]], dim=1)
        return x + F.silu(conv)


class GruForm(Form):
    """x += h, h = GRU(x, h). Trains through torch.nn.GRU, whose formula is the runtime's gru_cell twin
    (r, z, n gate order; n = tanh(x W_in + b_in + r (h W_hn + b_hn)), h' = n + z (h - n)), and faster: forward+
    backward of the default network (d_model 128, 4 layers; B 16, T 64; torch 2.13, 1 thread of a busy 2-core
    machine) took 142 ms through nn.GRU, 183 ms through a Python-level scan of the same formula; the 4 GRU
    layers alone (2 threads) 51 ms against 105 ms (71 ms for a loop of torch's fused gru_cell)."""

    def __init__(self, cfg, op, layer):
        super().__init__(cfg, op, layer)
        self.gru = nn.GRU(cfg.d_model, cfg.d_model, batch_first=True)  # its own init: uniform(+-1/sqrt(d))

    def add_weight(self, name, shape):
        pass  # in self.gru: weight_ih_l0 [3d, d] is gru.w_ih transposed, and so on


    def runtime_tensors(self):
        g, p = self.gru, self.prefix
        return {p + "gru.w_ih": g.weight_ih_l0.t(), p + "gru.w_hh": g.weight_hh_l0.t(),
                p + "gru.b_ih": g.bias_ih_l0, p + "gru.b_hh": g.bias_hh_l0}

    def sequence(self, x, out):
        return x + self.gru(x)[0]

    def step(self, x, state, out):
        key, g, d = f"recurrent_state.{self.layer}", self.gru, self.cfg.d_model
        h = state[key]
        gi = x @ g.weight_ih_l0.t() + g.bias_ih_l0
        gh = h @ g.weight_hh_l0.t() + g.bias_hh_l0
        rz = torch.sigmoid(gi[:, :2 * d] + gh[:, :2 * d])
        r, z = rz[:, :d], rz[:, d:]
        n = torch.tanh(gi[:, 2 * d:] + r * gh[:, 2 * d:])
        h = n + z * (h - n)
        state[key] = h
        return x + h


class SsmForm(Form):
    """x += y, the diagonal selective SSM (network.Ssm): h = exp(-dt exp(a_log)) h + dt xn B, y = h C + d xn.
    Init as Mamba's: a_log = log(1..N) per channel, d = 1, softplus(dt bias) log-uniform in [1e-3, 1e-1]."""

    def init_weight(self, name, shape):
        d, N = self.cfg.d_model, network.SSM_STATE
        if name.endswith("ssm.a_log"):
            return torch.log(torch.arange(1, N + 1, dtype=torch.float32)).expand(d, N).clone()
        if name.endswith("ssm.d"):
            return torch.ones(shape)
        if name.endswith("ssm.in.b"):
            b = torch.zeros(shape)
            dt = torch.exp(torch.rand(d) * math.log(100.0) + math.log(1e-3))
            b[:d] = dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)
            return b
        return super().init_weight(name, shape)

    def _project(self, x):
        """x [..., d] -> xn, dt, decay [..., d, N], input dt xn B [..., d, N], C [..., N]."""
        d, N = self.cfg.d_model, network.SSM_STATE
        xn = rmsnorm(x, self.w("ssm_norm.g"))
        proj = xn @ self.w("ssm.in.w") + self.w("ssm.in.b")
        dt = F.softplus(proj[..., :d])
        decay = torch.exp(-(torch.exp(self.w("ssm.a_log")) * dt[..., None]))
        drive = (dt * xn)[..., None] * proj[..., None, d:d + N]
        return xn, decay, drive, proj[..., d + N:]

    def sequence(self, x, out):
        xn, decay, drive, c = self._project(x)  # decay, drive [B, T, d, N]
        hs = ssm_scan(decay, drive)
        return x + (hs * c[:, :, None, :]).sum(-1) + self.w("ssm.d") * xn

    def step(self, x, state, out):
        key = f"ssm_state.{self.layer}"
        xn, decay, drive, c = self._project(x)
        h = state[key] * decay + drive  # [B, d, N]
        state[key] = h
        return x + (h * c[:, None, :]).sum(-1) + self.w("ssm.d") * xn


def ssm_scan(decay, drive):
    """h [B, T, d, N]: h_t = decay_t h_{t-1} + drive_t over T from h = 0 (LinearScan)."""
    return LinearScan.apply(decay, drive)


class LinearScan(torch.autograd.Function):
    """The SSM's recurrence as one autograd node: a loop over T forward, the adjoint loop backward
    (g_t = dL/dh_t + decay_{t+1} g_{t+1}; d drive_t = g_t, d decay_t = g_t h_{t-1}), each step one fused op on
    [B, d, N], T-major so every step's slice is contiguous. Autograd through a Python loop, or a log2(T)
    doubling scan, keeps a [B, T, d, N] zero-filled gradient per slice: forward+backward of the default config
    with mixer ssm (B 16, T 64, 1 thread) took 301 ms by doubling, 148 ms this way (T 256: 1811 ms, 635 ms)."""

    @staticmethod
    def forward(ctx, decay, drive):
        a, x = decay.movedim(1, 0).contiguous(), drive.movedim(1, 0).contiguous()  # [T, B, d, N]
        h = torch.empty_like(x)
        h[0] = x[0]
        for t in range(1, len(h)):
            torch.addcmul(x[t], a[t], h[t - 1], out=h[t])
        ctx.save_for_backward(a, h)
        return h.movedim(0, 1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_h):
        a, h = ctx.saved_tensors
        g = grad_h.movedim(1, 0).contiguous()
        grad_drive = torch.empty_like(g)
        grad_drive[-1] = g[-1]
        for t in range(len(g) - 2, -1, -1):
            torch.addcmul(g[t], a[t + 1], grad_drive[t + 1], out=grad_drive[t])
        grad_decay = torch.empty_like(g)
        grad_decay[0] = 0.0  # h_{-1} = 0
        torch.mul(grad_drive[1:], h[:-1], out=grad_decay[1:])
        return grad_decay.movedim(0, 1), grad_drive.movedim(0, 1)


class AttentionForm(Form):
    """x += out(attention(rmsnorm(x))) over the last kv_window positions, this one included."""

    def _qkv(self, x):
        return rmsnorm(x, self.w("attn_norm.g")) @ self.w("qkv.w") + self.w("qkv.b")

    def _out(self, a):
        return a @ self.w("out.w") + self.w("out.b")

    def sequence(self, x, out):
        B, T, d = x.shape
        H, W = self.cfg.n_heads, self.cfg.kv_window
        q, k, v = (t.reshape(B, T, H, d // H).transpose(1, 2) for t in self._qkv(x).split(d, dim=-1))
        t = torch.arange(T, device=x.device)
        causal_window = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - W)  # [query, key]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_window)  # [B, H, T, hd]
        return x + self._out(a.transpose(1, 2).reshape(B, T, d))

    def step(self, x, state, out):
        B, d = x.shape
        H, W, pos = self.cfg.n_heads, self.cfg.kv_window, state["step"]
        hd = d // H
        q, k, v = self._qkv(x).split(d, dim=-1)
        slot = torch.tensor([pos % W], device=x.device)
        for name, new in ((f"k_cache.{self.layer}", k), (f"v_cache.{self.layer}", v)):
            state[name] = state[name].index_copy(1, slot, new[:, None])
        keys = state[f"k_cache.{self.layer}"].reshape(B, W, H, hd).transpose(1, 2)  # [B, H, W, hd]
        values = state[f"v_cache.{self.layer}"].reshape(B, W, H, hd).transpose(1, 2)
        scores = (keys @ q.reshape(B, H, hd, 1))[..., 0] / math.sqrt(hd)  # [B, H, W]
        written = torch.arange(W, device=x.device) <= pos  # slots 0..pos before the window first wraps
        p = torch.softmax(scores.masked_fill(~written, -math.inf), dim=-1)
        return x + self._out((p[:, :, None, :] @ values)[:, :, 0].reshape(B, d))


class MlpForm(Form):
    def _apply(self, x):
        hmid = F.silu(rmsnorm(x, self.w("mlp_norm.g")) @ self.w("mlp.w1") + self.w("mlp.b1"))
        return x + hmid @ self.w("mlp.w2") + self.w("mlp.b2")

    def sequence(self, x, out):
        return self._apply(x)

    def step(self, x, state, out):
        return self._apply(x)


class ChunkHeadForm(Form):
    """chunk = tanh(head(rmsnorm(x))) [K*A]; step also blends the ring of the last K chunks (mtp_state) into the
    action, in robot units. The sequence form leaves the blend to FlashRTPolicy.blend (training wants chunks)."""

    def __init__(self, cfg, op, layer):
        super().__init__(cfg, op, layer)
        self.register_buffer("blend_w", torch.from_numpy(blend_weights(cfg)), persistent=False)

    def _chunk(self, x):
        return torch.tanh(rmsnorm(x, self.w("head_norm.g")) @ self.w("head.w") + self.w("head.b"))

    def sequence(self, x, out):
        out["chunks"] = self._chunk(x).unflatten(-1, (self.cfg.chunk_len, self.cfg.action_dim))
        return x

    def step(self, x, state, out):
        K, A, t = self.cfg.chunk_len, self.cfg.action_dim, state["step"]
        ring = state["mtp_state"].index_copy(1, torch.tensor([t % K], device=x.device), self._chunk(x)[:, None])
        state["mtp_state"] = ring  # [B, K, K*A], slot = step % K
        ages = range(min(t + 1, K))
        blended = sum(self.blend_w[age] * ring[:, (t - age) % K, age * A:(age + 1) * A] for age in ages)
        wsum = float(sum(float(self.blend_w[age]) for age in ages))  # float64, as the twin sums
        out["action"] = blended * float(np.float32(1.0 / wsum)) * self.w("action_scale") + self.w("action_offset")
        return x


class NoiseForm(Form):
    """Identity: exploration noise is the runtime's (module docstring)."""

    def sequence(self, x, out):
        return x

    def step(self, x, state, out):
        return x


class MetaAdvanceForm(Form):
    """The step counter (meta's step = position; kv_len follows from it)."""

    def initial_state(self, batch, device):
        return {"step": 0}

    def sequence(self, x, out):
        return x

    def step(self, x, state, out):
        state["step"] += 1
        return x


TORCH_FORMS: dict[type[network.Op], type[Form]] = {
    network.Input: InputForm, network.CausalConv: CausalConvForm, network.Gru: GruForm, network.Ssm: SsmForm,
    network.Attention: AttentionForm, network.Mlp: MlpForm, network.ChunkHead: ChunkHeadForm,
    network.Noise: NoiseForm, network.MetaAdvance: MetaAdvanceForm,
}


# ---- the policy ------------------------------------------------------------------------------------------
class FlashRTPolicy(nn.Module):
    """The hybrid policy of ``cfg`` in PyTorch. Train with ``forward_sequence`` on windows from step 0, infer
    with ``select_action`` (LeRobot-style), ship with ``save_pretrained`` (a policy file the runtime loads)."""

    def __init__(self, cfg: PolicyConfig, *, obs_names=(), action_names=()):
        super().__init__()
        self.cfg = cfg
        for key, names, dim in (("obs_names", obs_names, cfg.obs_dim), ("action_names", action_names,
                                                                         cfg.action_dim)):
            if names and len(names) != dim:
                raise ValueError(f"{key}: {len(names)} names for {dim} channels")
        self.obs_names, self.action_names = tuple(obs_names), tuple(action_names)
        forms = []
        for op, layer in network.walk(cfg):
            form = TORCH_FORMS.get(type(op))
            if form is None:
                raise NotImplementedError(f"{type(op).__name__}: an op of network.py without a torch form "
                                          "(add one to TORCH_FORMS in flashrt_ros/train/reference.py)")
            forms.append(form(cfg, op, layer))
        self.forms = nn.ModuleList(forms)
        self._state = None  # select_action's

    @property
    def input(self) -> InputForm:  # properties, not attributes: an attribute would list the module twice
        return next(f for f in self.forms if isinstance(f, InputForm))

    @property
    def head(self) -> ChunkHeadForm:
        return next(f for f in self.forms if isinstance(f, ChunkHeadForm))

    # ---- training ---------------------------------------------------------------------------------------
    def forward_sequence(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, T, obs_dim] (raw, from step 0) -> chunks [B, T, chunk_len, action_dim], normalised units."""
        if obs.dim() != 3 or obs.shape[1] < 1 or obs.shape[-1] != self.cfg.obs_dim:
            raise ValueError(f"obs: expected [B, T >= 1, {self.cfg.obs_dim}], got {list(obs.shape)}")
        out, x = {}, obs
        for form in self.forms:
            x = form.sequence(x, out)
        return out["chunks"]

    forward = forward_sequence

    def blend(self, chunks: torch.Tensor) -> torch.Tensor:
        """chunks [B, T, K, A] from step 0 -> actions [B, T, A] in robot units: the temporal ensemble the
        runtime runs (action t blends chunk_{t-age}[age] for age < min(t + 1, K)), then scale and offset."""
        B, T, K, A = chunks.shape
        w = self.head.blend_w
        total = torch.zeros(B, T, A, dtype=chunks.dtype, device=chunks.device)
        for age in range(min(K, T)):
            total = total + w[age] * F.pad(chunks[:, :T - age, age], (0, 0, age, 0))  # row t: chunk t-age
        wsum = np.cumsum(w.cpu().numpy().astype(np.float64))[np.minimum(np.arange(T), K - 1)]
        inv = torch.from_numpy((1.0 / wsum).astype(np.float32)).to(chunks.device)
        return self.denormalize_actions(total * inv[:, None])

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Robot units -> the head's units (what forward_sequence's chunks are compared with)."""
        return (actions - self.head.w("action_offset")) / self.head.w("action_scale")

    def denormalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return actions * self.head.w("action_scale") + self.head.w("action_offset")

    @torch.no_grad()
    def set_normalization(self, obs_mean, obs_std, action_scale, action_offset, *, min_obs_std: float = MIN_OBS_STD):
        """Observation mean/std and the action's scale/offset (robot = head * scale + offset), from the data.
        obs_inv_std = 1 / obs_std, and 1 where obs_std < min_obs_std (a constant channel: 1e6 would turn any
        later change of it into a huge input)."""
        inp = self.input
        values = {"obs_mean": obs_mean, "obs_std": obs_std, "action_scale": action_scale,
                  "action_offset": action_offset}
        t = {}
        for key, v in values.items():
            t[key] = torch.as_tensor(np.asarray(v, np.float32))
            dim = self.cfg.obs_dim if key.startswith("obs") else self.cfg.action_dim
            if t[key].shape != (dim,) or not torch.isfinite(t[key]).all():
                raise ValueError(f"{key}: expected {dim} finite values, got shape {list(t[key].shape)}")
        if (t["obs_std"] < 0).any():
            raise ValueError("obs_std: a standard deviation is >= 0")
        if (t["action_scale"] == 0).any():
            raise ValueError("action_scale: a zero scale maps every action to the offset")
        inp.w("obs_mean").copy_(t["obs_mean"])
        std = t["obs_std"]
        inp.w("obs_inv_std").copy_(torch.where(std < min_obs_std, 1.0, 1.0 / std))
        self.head.w("action_scale").copy_(t["action_scale"])
        self.head.w("action_offset").copy_(t["action_offset"])

    # ---- stepping --------------------------------------------------------------------------------------
    def initial_state(self, batch: int = 1) -> dict:
        """The zero state of ``batch`` rows, named as the runtime's state_tensors (plus "step")."""
        device = self.head.w("head.w").device
        state = {}
        for form in self.forms:
            state.update(form.initial_state(batch, device))
        return state

    def step(self, obs: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        """One step: obs [B, obs_dim] raw -> (action [B, action_dim] in robot units, the next state)."""
        state, out, x = dict(state), {}, obs
        for form in self.forms:
            x = form.step(x, state, out)
        return out["action"], state

    def reset(self) -> None:
        self._state = None

    @torch.no_grad()
    def select_action(self, obs) -> torch.Tensor:
        """The next action for obs [obs_dim] or [B, obs_dim] (a tensor or an array), keeping the state across
        calls until reset()."""
        device = self.head.w("head.w").device
        o = torch.as_tensor(obs, dtype=torch.float32, device=device)
        batched = o.dim() == 2
        o = o if batched else o[None]
        if self._state is None:
            self._state = self.initial_state(o.shape[0])
        elif self._state["mtp_state"].shape[0] != o.shape[0]:
            raise ValueError(f"select_action: {o.shape[0]} rows after {self._state['mtp_state'].shape[0]}; "
                             "reset() first")
        action, self._state = self.step(o, self._state)
        return action if batched else action[0]

    # ---- the policy file -------------------------------------------------------------------------------
    def to_flashrt_weights(self) -> dict[str, np.ndarray]:
        """Every weight under the runtime's name, in its layout, float32, in weight_specs order."""
        out = {}
        for form in self.forms:
            for name, t in form.runtime_tensors().items():
                out[name] = t.detach().to("cpu", torch.float32).numpy().copy()
        return out

    def load_flashrt_weights(self, weights: dict[str, np.ndarray]) -> None:
        """The runtime's weights (a Session's, a policy file's tensors): every name and shape checked."""
        checked = check_weights(dict(weights), HybridPolicy(self.cfg).weight_specs(), "load_flashrt_weights")
        checked = {k: v for k, v in checked.items() if not k.startswith(CONST_PREFIX)}
        for form in self.forms:
            form.load_runtime(checked)

    def save_pretrained(self, path: str | Path) -> Path:
        """Write the policy file (a directory gets policy.safetensors in it); returns the file's path."""
        path = _policy_file(path)
        save_policy(path, self.cfg, self.to_flashrt_weights(), self.obs_names, self.action_names)
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, base: PolicyConfig | None = None) -> FlashRTPolicy:
        """The policy of a file: its architecture (over ``base``'s other fields), weights and channel names."""
        path = _policy_file(path)
        cfg = config_from_policy(path, base).replace(policy_path="")
        pf = read_policy(path)
        model = cls(cfg, obs_names=pf.obs_names, action_names=pf.action_names)
        model.load_flashrt_weights(pf.tensors)
        return model.eval()


def _policy_file(path: str | Path) -> Path:
    path = Path(path)
    return path / POLICY_FILE_NAME if path.is_dir() else path
