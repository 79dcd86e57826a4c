"""The PyTorch reference module (flashrt_ros/train/reference.py): derived from the op list, trained here, then the
same policy file steps identically in every CPU backend of the runtime."""
from __future__ import annotations

import numpy as np
import pytest
import torch  # noqa: E402 - collected only where PyTorch is installed (conftest.py)
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from conftest import CPU_BACKENDS, observation_trace, small_config
from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.model import kernels, network
from flashrt_ros.runtime.model.policy import HybridPolicy
from flashrt_ros.runtime.model.policy_file import read_policy
from flashrt_ros.train.reference import (  # noqa: E402
    NORMALISATION,
    TORCH_FORMS,
    FlashRTPolicy,
    GruForm,
    ssm_scan,
)

STEPS = 500  # past kv_window (48) many times: the KV window and the chunk ring wrap
ATOL = 1e-5  # GEMM vs GEMV summation order, float32
# gru with the default blend; ssm with the oldest-first blend (ACT's), so both blend signs are checked
CONFIGS = {"gru": small_config(mixer="gru"),
           "ssm": small_config(mixer="ssm", chunk_blend="oldest", chunk_blend_decay=0.5)}
OBS_NAMES = tuple(f"joint{j}.{q}" for q in ("pos", "vel") for j in range(7))
ACTION_NAMES = tuple(f"joint{j}" for j in range(7))


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny ops: a second intra-op thread only waits for a core (10x slower steps on a loaded 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train_a_few_steps(cfg: PolicyConfig, seed: int = 0) -> FlashRTPolicy:
    """Behaviour cloning on random data for a few Adam steps, with data-sized normalisation: weights that are
    neither the init nor the runtime's seeded ones, and units that are not the identity."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = FlashRTPolicy(cfg, obs_names=OBS_NAMES, action_names=ACTION_NAMES)
    obs = torch.from_numpy(np.stack([observation_trace(96, cfg.obs_dim, seed=s) for s in range(4)]))
    actions = torch.from_numpy(rng.uniform(-2.0, 3.0, (4, 96, cfg.chunk_len, cfg.action_dim)).astype(np.float32))
    model.set_normalization(obs.mean((0, 1)), obs.std((0, 1)), rng.uniform(0.5, 2.5, cfg.action_dim),
                            rng.uniform(-1.0, 1.0, cfg.action_dim))
    before = model.to_flashrt_weights()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(5):
        opt.zero_grad()
        loss = (model.forward_sequence(obs) - model.normalize_actions(actions)).square().mean()
        loss.backward()
        opt.step()
    after = model.to_flashrt_weights()
    assert [n for n in after if np.array_equal(after[n], before[n])] == list(NORMALISATION)  # the rest trained
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def trained(request, tmp_path_factory):
    """(cfg, model, policy file) per mixer."""
    cfg = CONFIGS[request.param]
    model = train_a_few_steps(cfg)
    path = model.save_pretrained(tmp_path_factory.mktemp(request.param) / "policy.safetensors")
    return cfg, model, path


def reference_actions(model: FlashRTPolicy, obs: np.ndarray) -> np.ndarray:
    model.reset()
    return np.stack([model.select_action(o).numpy() for o in obs])


# ---- derived from the op list ---------------------------------------------------------------------------
@pytest.mark.parametrize("mixer", sorted(network.MIXERS))
def test_every_op_of_the_network_has_a_torch_form(mixer):
    cfg = small_config(mixer=mixer)
    missing = {type(op).__name__ for op, _ in network.walk(cfg)} - {c.__name__ for c in TORCH_FORMS}
    assert not missing, f"ops without a torch form in reference.py: {sorted(missing)}"
    model = FlashRTPolicy(cfg)
    names = [s.name for s in HybridPolicy(cfg).weight_specs() if not s.name.startswith("const.")]
    assert list(model.to_flashrt_weights()) == names  # every weight, under its runtime name, in network order


def test_an_op_without_a_torch_form_is_refused_naming_it(monkeypatch):
    class Gate(network.Op):
        pass

    monkeypatch.setitem(network.MIXERS, "gru", Gate())
    with pytest.raises(NotImplementedError, match="Gate"):
        FlashRTPolicy(small_config())


@pytest.mark.parametrize("mixer", sorted(network.MIXERS))
def test_the_runtimes_weights_load_and_export_unchanged(mixer):
    cfg = small_config(mixer=mixer)
    session = Session(cfg)
    model = FlashRTPolicy(cfg)
    model.load_flashrt_weights(session.weights)
    for name, w in model.to_flashrt_weights().items():
        assert w.dtype == np.float32 and np.array_equal(w, session.weights[name]), name


def test_torch_gru_is_the_runtimes_gru_cell():
    """nn.GRU (the training form) and the step form against kernels.gru_cell_ref, on the same weights."""
    cfg = small_config()
    d = cfg.d_model
    torch.manual_seed(1)
    form = GruForm(cfg, network.Gru(), 0)
    w = {k.removeprefix("layers.0."): v.detach().numpy().copy() for k, v in form.runtime_tensors().items()}
    rng = np.random.default_rng(1)
    x, h = rng.standard_normal((3, d)).astype(np.float32), rng.uniform(-1, 1, (3, d)).astype(np.float32)
    gi, gh, h_new = (np.empty((3, n), np.float32) for n in (3 * d, 3 * d, d))
    kernels.gru_cell_ref(x, h, w["gru.w_ih"], w["gru.w_hh"], w["gru.b_ih"], w["gru.b_hh"], gi, gh, h_new)
    with torch.no_grad():
        _, h_torch = form.gru(torch.from_numpy(x)[:, None], torch.from_numpy(h)[None])
        state = {"recurrent_state.0": torch.from_numpy(h)}
        form.step(torch.from_numpy(x), state, {})
    np.testing.assert_allclose(h_torch[0].numpy(), h_new, rtol=0, atol=1e-6)
    np.testing.assert_allclose(state["recurrent_state.0"].numpy(), h_new, rtol=0, atol=1e-6)


def test_the_ssm_scan_and_its_gradient_are_the_sequential_recurrences():
    torch.manual_seed(2)
    decay = torch.rand(2, 33, 5, 3, dtype=torch.float64, requires_grad=True)
    drive = torch.randn(2, 33, 5, 3, dtype=torch.float64, requires_grad=True)
    h, want = torch.zeros(2, 5, 3, dtype=torch.float64), []
    for t in range(33):
        h = decay[:, t] * h + drive[:, t]
        want.append(h)
    torch.testing.assert_close(ssm_scan(decay, drive), torch.stack(want, 1), rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(ssm_scan, (decay[:1, :9, :2, :2].detach().requires_grad_(),
                                               drive[:1, :9, :2, :2].detach().requires_grad_()))


# ---- a trained policy, in the runtime ---------------------------------------------------------------------
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_trained_policy_file_steps_in_the_runtime_as_the_reference_steps(trained, backend):
    cfg, model, path = trained
    obs = observation_trace(STEPS, cfg.obs_dim, seed=7) * 1.5
    session = Session(cfg.replace(weights_path=str(path)), backend=backend)
    state, want = model.initial_state(1), []
    with torch.no_grad():
        for o in obs:
            action, state = model.step(torch.from_numpy(o)[None], state)
            want.append(action[0].numpy())
    got = np.stack([session.step(o).action for o in obs])
    assert np.abs(want).max() > 1.0  # robot units: the scale and offset are applied, not only the tanh head
    np.testing.assert_allclose(got, np.stack(want), rtol=0, atol=ATOL)
    runtime_state = session.state_tensors()  # the reference's state is named as the runtime's
    for name, value in state.items():
        if name != "step":
            np.testing.assert_allclose(value[0].numpy(), runtime_state[name], rtol=1e-5, atol=1e-4, err_msg=name)
    assert state["step"] == int(runtime_state["meta"][0]) == STEPS


def test_a_policy_file_is_its_own_config(trained):
    """policy_path: the file's architecture, weights and channel names, with no sizes in the config."""
    cfg, model, path = trained
    session = Session(PolicyConfig(policy_path=str(path), capsule_budget_mb=64.0))
    assert {f: getattr(session.cfg, f) for f in ("d_model", "mixer", "chunk_blend", "kv_window")} == \
        {f: getattr(cfg, f) for f in ("d_model", "mixer", "chunk_blend", "kv_window")}
    obs = observation_trace(60, cfg.obs_dim, seed=3)
    np.testing.assert_allclose([session.step(o).action for o in obs], reference_actions(model, obs), rtol=0,
                               atol=ATOL)
    loaded = FlashRTPolicy.from_pretrained(path)
    assert (loaded.obs_names, loaded.action_names) == (OBS_NAMES, ACTION_NAMES)
    assert loaded.cfg.mixer == cfg.mixer and loaded.cfg.chunk_blend == cfg.chunk_blend
    for name, w in model.to_flashrt_weights().items():
        assert np.array_equal(loaded.to_flashrt_weights()[name], w), name


def test_forward_sequence_then_blend_is_stepping(trained):
    """The training form (parallel in time, from a zero state) against the step form, over the same sequence:
    the conv, the recurrences, the attention window (wrapping: T > kv_window) and the temporal ensemble."""
    cfg, model, _ = trained
    obs = np.stack([observation_trace(STEPS, cfg.obs_dim, seed=s) for s in (4, 5)])
    with torch.no_grad():
        chunks = model.forward_sequence(torch.from_numpy(obs))
        blended = model.blend(chunks).numpy()
        state, stepped = model.initial_state(2), []
        for t in range(STEPS):
            action, state = model.step(torch.from_numpy(obs[:, t]), state)
            stepped.append(action.numpy())
    assert chunks.shape == (2, STEPS, cfg.chunk_len, cfg.action_dim) and chunks.abs().max() <= 1.0
    np.testing.assert_allclose(blended, np.stack(stepped, 1), rtol=0, atol=ATOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_a_16_bit_file_loads_with_exactly_its_widened_weights(trained, dtype, tmp_path):
    cfg, _, path = trained
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        narrow = {name: f.get_tensor(name).to(dtype) for name in f.keys()}  # noqa: SIM118 - safe_open has no iter
    narrow_path = tmp_path / "narrow.safetensors"
    save_file(narrow, str(narrow_path), metadata=meta)
    assert read_policy(narrow_path).widened
    for session_cfg in (cfg.replace(weights_path=str(narrow_path)), PolicyConfig(policy_path=str(narrow_path))):
        session = Session(session_cfg)
        for name, t in narrow.items():
            assert np.array_equal(session.weights[name], t.float().numpy()), name
    loaded = FlashRTPolicy.from_pretrained(narrow_path)
    for name, w in loaded.to_flashrt_weights().items():
        assert np.array_equal(w, narrow[name].float().numpy()), name


@pytest.mark.parametrize("field, value", [("n_heads", 4), ("chunk_len", 5), ("mixer", None)])
def test_a_file_for_another_architecture_is_refused_naming_the_field(trained, field, value):
    cfg, _, path = trained
    if field == "mixer":
        value = "ssm" if cfg.mixer == "gru" else "gru"
    with pytest.raises(ValueError, match=field):
        Session(cfg.replace(weights_path=str(path), **{field: value}))


# ---- normalisation and the facade ----------------------------------------------------------------------
def test_normalisation_maps_robot_units_to_the_heads_and_back():
    cfg = small_config()
    model = FlashRTPolicy(cfg)
    std = np.linspace(0.0, 2.0, cfg.obs_dim)  # a constant channel first: std 0
    model.set_normalization(np.ones(cfg.obs_dim), std, np.full(cfg.action_dim, 2.0), np.full(cfg.action_dim, -1.0))
    inv_std = model.to_flashrt_weights()["obs_inv_std"]
    assert inv_std[0] == 1.0 and inv_std[-1] == np.float32(0.5)  # the constant channel: centred, not scaled
    a = torch.randn(3, cfg.action_dim)
    torch.testing.assert_close(model.normalize_actions(a), (a + 1.0) / 2.0)
    torch.testing.assert_close(model.denormalize_actions(model.normalize_actions(a)), a)
    with pytest.raises(ValueError, match="action_scale"):
        model.set_normalization(np.zeros(cfg.obs_dim), np.ones(cfg.obs_dim), np.zeros(cfg.action_dim),
                                np.zeros(cfg.action_dim))
    with pytest.raises(ValueError, match="obs_mean"):
        model.set_normalization(np.zeros(3), np.ones(cfg.obs_dim), np.ones(cfg.action_dim), np.zeros(cfg.action_dim))


def test_select_action_keeps_its_state_until_reset():
    cfg = small_config()
    model = FlashRTPolicy(cfg).eval()
    obs = observation_trace(10, cfg.obs_dim)
    first = reference_actions(model, obs)
    again = reference_actions(model, obs)  # reset() inside: the same episode again
    assert np.array_equal(first, again) and not np.allclose(first[1:], first[:-1])
    with pytest.raises(ValueError, match="reset"):
        model.select_action(np.stack([obs[0], obs[1]]))
