"""A mixer is added through five hooks and nothing else: its op (the mixer choice), its kernel spec, its NumPy
twin, its .cu and its numba kernel. The leaky integrator here registers through those five at test time, with
no edit to config validation, the compiled CPU program, the launch tables or any other file, and then steps
on the numpy, cpu and CUDA-on-CPU backends as its twin computes."""
from pathlib import Path

import numpy as np
import pytest
from cuda_on_cpu.cpu_module import CpuRawModule
from cuda_on_cpu.shim_backend import ShimBackend
from numba import njit

from conftest import assert_states_close, observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.engine import cpu_registry
from flashrt_ros.runtime.engine.launch_table import LAUNCHERS
from flashrt_ros.runtime.engine.nvrtc import compile_cubin, nvrtc_unavailable
from flashrt_ros.runtime.model import kernel_spec, kernels, network
from flashrt_ros.runtime.model.buffers import BufferSpec

CU = Path(__file__).parent / "mixer_hooks" / "leaky.cu"
OBS = observation_trace(120)


# ---- the five hooks ---------------------------------------------------------------------------------
class Leaky(network.Op):
    """x += h, h += k (x - h) with k = a^2 / (1 + a^2) per channel: a leaky integrator of the residual."""

    def state(self, cfg, layer):
        return [BufferSpec(f"leaky_state.{layer}", (cfg.d_model,), "float32", "recurrent")]

    def weights(self, cfg, layer):
        return [(f"layers.{layer}.leaky.a", (cfg.d_model,))]

    def scratch(self, cfg):
        return [("leaky_k", (cfg.d_model,))]

    def step(self, plan, cfg, layer):
        plan.add("leaky_step", "x", f"leaky_state.{layer}", f"layers.{layer}.leaky.a", "leaky_k",
                 label=f"L{layer}.leaky")

    def sequence(self, seq, x, layer):
        a = seq.w(f"layers.{layer}.leaky.a")
        k = a * a / (a * a + np.float32(1.0))
        h = seq.xp.zeros(seq.cfg.d_model, seq.xp.float32)
        hs = seq.xp.empty_like(x)
        for t in range(seq.n):
            h = h + k * (x[t] - h)
            hs[t] = h
        seq.live(f"leaky_state.{layer}")[...] = h
        return x + hs


def leaky_step_ref(x, h, a, k):
    np.multiply(a, a, out=k)
    np.divide(k, k + np.float32(1.0), out=k)
    h += k * (x - h)
    x += h


@njit(nogil=True)
def leaky_step(x, h, a, k, d):
    for c in range(d):
        r = a[c] * a[c]
        k[c] = r / (r + np.float32(1.0))
        h[c] += k[c] * (x[c] - h[c])
        x[c] += h[c]


TABLES = (kernel_spec.SPECS, kernels.REGISTRY, cpu_registry.COMPILED, network.MIXERS)


@pytest.fixture(scope="module")
def leaky():
    saved = [dict(t) for t in TABLES]
    network.MIXERS["leaky"] = Leaky()
    kernel_spec.spec("leaky_step", "x:f32[B,d]:rw h:f32[B,d]:rw a:f32[d] k:f32[B,d]:w",
                     (str(CU), "leaky_step_f32", "x x_rs h h_rs a k k_rs B d", kernel_spec.items("B * d")))
    kernels.kernel(leaky_step_ref)
    cpu_registry.compiled(leaky_step)
    yield
    for table, before in zip(TABLES, saved):
        table.clear()
        table.update(before)


# ---- what they give -------------------------------------------------------------------------------------
def _operands(B=3, d=20, seed=0):
    rng = np.random.default_rng(seed)
    x, h = rng.standard_normal((2, B, d)).astype(np.float32)
    return x, h, rng.standard_normal(d).astype(np.float32), np.zeros((B, d), np.float32)


def test_the_kernel_on_every_backend_gives_the_twins_bytes(leaky):
    want = _operands()
    leaky_step_ref(*want)
    compiled = _operands()
    for b in range(compiled[0].shape[0]):
        leaky_step(compiled[0][b], compiled[1][b], compiled[2], compiled[3][b], compiled[0].shape[1])
    cuda = _operands()
    (la,) = LAUNCHERS["leaky_step"](*cuda)
    CpuRawModule(CU).get_function(la.function)(la.grid, la.block, la.args)
    for got in (compiled, cuda):
        assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


@pytest.mark.skipif(nvrtc_unavailable() is not None, reason=str(nvrtc_unavailable()))
def test_the_mixers_cuda_source_compiles_with_nvrtc_for_the_robot():
    cubin, log = compile_cubin(CU, 87)
    assert cubin[:4] == b"\x7fELF", log


def test_a_session_of_the_third_mixer_steps_on_numpy_cpu_and_the_cuda_kernels_and_prefills(leaky):
    cfg = small_config(mixer="leaky")
    ref, cpu, shim = Session(cfg, "numpy"), Session(cfg, "cpu"), Session(cfg, ShimBackend())
    actions = {s: np.stack([s.step(o).action for o in OBS]) for s in (ref, cpu, shim)}
    state = ref.state_tensors()
    assert np.abs(state["leaky_state.1"]).max() > 0.1  # it carries the load
    assert not any(n.startswith(("recurrent_state", "ssm_state")) for n in state)
    for other in (cpu, shim):  # the GEMVs and attention sum in another order: 2e-5 as test_cpu_backend
        np.testing.assert_allclose(actions[other], actions[ref], rtol=0, atol=2e-5)
        assert_states_close(other.state_tensors(), state, atol=2e-4)
    ref.cold_prefill()  # its sequence form rebuilds the state from the history
    assert_states_close(ref.state_tensors(), state, atol=4e-5)


def test_the_third_mixer_replans_and_restores_byte_exactly_on_the_compiled_step(leaky):
    s = Session(small_config(mixer="leaky"), "cpu")
    for o in OBS[:60]:
        s.step(o)
    cid = s.pin(s.live_capsule_id).id
    branches = np.stack([OBS[60:70], OBS[80:90] * 0.5])
    res = s.replan(cid, branches)
    for b in range(2):
        s.rollback(cid)
        assert np.stack([s.step(o).action for o in branches[b]]).tobytes() == res.actions[b].tobytes()


def test_a_numba_kernel_registers_only_under_a_plan_kernel_and_with_its_specs_names(leaky):
    @njit
    def leaky_step(x, h, a, k, width):
        pass

    @njit
    def leaky_scan(x, d):
        pass

    with pytest.raises(TypeError, match=r"\['width'\] are neither buffers nor symbols of its spec \['B', 'd'\]"):
        cpu_registry.compiled(leaky_step)
    with pytest.raises(TypeError, match="leaky_scan: no plan kernel of that name"):
        cpu_registry.compiled(leaky_scan)
    assert cpu_registry.COMPILED["leaky_step"].fn is not leaky_step


def test_the_mixer_choice_is_the_op_list(leaky):
    assert small_config(mixer="leaky").mixer == "leaky"
    saved = network.MIXERS.pop("leaky")
    try:
        with pytest.raises(ValueError, match="mixer: must be one of gru, ssm, got 'leaky'"):
            small_config(mixer="leaky")
    finally:
        network.MIXERS["leaky"] = saved
