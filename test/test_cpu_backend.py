"""The compiled CPU backend (backend: cpu): the NumPy reference's math within a stated tolerance, every row of a
batch byte-identical to that row stepped alone whatever the batch and its page sharing, one call that allocates
nothing. The contract tests (determinism, replan, persistence, session contracts) run on it too."""
import numpy as np
import pytest

from conftest import observation_trace, small_config
from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.engine.backend import select

# Against the NumPy reference: another summation order per dot product (BLAS vs in-order loops), so the
# bytes differ; measured over 300 steps the differences stay below 1e-6 on actions and 1e-5 on the state.
ACTION_ATOL, STATE_ATOL = 2e-5, 2e-4


def _run_both(cfg, obs):
    ref, cpu = Session(cfg, backend="numpy"), Session(cfg, backend="cpu")
    worst = 0.0
    for o in obs:
        a, b = ref.step(o).action, cpu.step(o).action
        worst = max(worst, float(np.abs(a - b).max()))
    return ref, cpu, worst


@pytest.mark.parametrize("kw", [dict(mixer="gru"), dict(mixer="ssm"), dict(action_noise_std=0.1, seed=3)],
                         ids=["gru", "ssm", "noise"])
def test_compiled_step_agrees_with_numpy_within_the_stated_tolerance(kw):
    ref, cpu, worst = _run_both(small_config(**kw), observation_trace(300))  # the 48-step window wraps 6 times
    assert worst <= ACTION_ATOL
    want, got = ref.state_tensors(), cpu.state_tensors()
    for name, w in want.items():
        if w.dtype.kind == "i":
            assert np.array_equal(got[name], w), name
        else:
            np.testing.assert_allclose(got[name], w, rtol=0, atol=STATE_ATOL, err_msg=name)


def test_compiled_step_agrees_with_numpy_at_the_default_config_past_a_full_window():
    ref, cpu, worst = _run_both(PolicyConfig(capsule_budget_mb=64.0), observation_trace(1100))
    assert worst <= ACTION_ATOL
    assert ref.state_tensors()["meta"].tobytes() == cpu.state_tensors()["meta"].tobytes()


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_every_row_of_a_batch_equals_the_row_stepped_alone_whatever_the_batch_size(rows):
    """Rows 1..rows start as copies of the live row and read the very same KV pages (all of them shared),
    then one batched step: each row's bytes equal one live step's."""
    s = Session(small_config(), backend="cpu")
    obs = observation_trace(90)
    for o in obs[:89]:
        s.step(o)
    arena = s.arena
    for r in range(1, rows + 1):
        arena.state[r] = arena.state[0]
        arena["obs"][r] = obs[89]
    arena["obs"][0] = obs[89]
    batch = s.backend.bind(s.plan, arena, 1, rows)
    batch.replay()
    s._live.replay()
    for r in range(1, rows + 1):
        assert arena.state[r].tobytes() == arena.state[0].tobytes(), f"row {r} of {rows}"
        assert arena["action"][r].tobytes() == arena["action"][0].tobytes(), f"row {r} of {rows}"


def test_a_replay_allocates_nothing_but_its_argument_wrappers():
    """Crossing into compiled code wraps each of the 7 arrays passed (a fixed-size record, no data); the step
    itself allocates nothing, whatever the batch."""
    from numba.core.runtime import _nrt_python, rtsys

    _nrt_python.memsys_enable_stats()  # counts every allocation of compiled code from here on
    s = Session(small_config(), backend="cpu")
    for o in observation_trace(5):
        s.step(o)
    per_call = {}
    for rows in (1, 8):
        runner = s.backend.bind(s.plan, s.arena, 1, rows)
        before = rtsys.get_allocation_stats()
        for _ in range(3):
            runner.replay()
        after = rtsys.get_allocation_stats()
        per_call[rows] = (after.alloc - before.alloc) / 3
    assert per_call == {1: 7, 8: 7}


def test_the_backend_names_itself_and_an_unknown_name_lists_the_choices():
    assert select("cpu").name == "cpu"
    with pytest.raises(ValueError, match="auto, numpy, cpu or cuda"):
        select("gpu")


@pytest.mark.parametrize("machine, features, warned", [
    ("x86_64", "+avx,+avx2,+fma", False), ("x86_64", "+avx,-fma", True), ("x86_64", "-avx,+fma", True),
    ("x86_64", "", True), ("aarch64", "", False)])
def test_the_cpu_backend_warns_once_when_numba_compiles_for_an_x86_target_without_fma(monkeypatch, caplog, machine,
                                                                                      features, warned):
    """-avx: NUMBA_ENABLE_AVX=0 (FMA3 needs AVX); "": a named CPU such as NUMBA_CPU_NAME=generic."""
    from flashrt_ros.runtime.engine import backend

    monkeypatch.setattr(backend.platform, "machine", lambda: machine)
    monkeypatch.setattr(backend, "_compiled_cpu_features", lambda: features)
    monkeypatch.setattr(backend, "_fma_warned", False)
    with caplog.at_level("WARNING", logger="flashrt_ros.runtime"):
        assert select("cpu").name == "cpu"
        assert select("cpu").name == "cpu"
    assert caplog.text.count("no FMA unit") == int(warned)


def test_this_machine_compiles_for_a_target_with_fma():
    """The features are read from numba's own target (x86 CI machines and the Jetson all have FMA)."""
    from flashrt_ros.runtime.engine import backend

    assert not backend.cpu_lacks_fma()
    if backend.platform.machine().lower() in ("x86_64", "amd64"):
        assert "+fma" in backend._compiled_cpu_features().split(",")


def test_live_steps_and_replans_share_the_one_signature_compiled_at_construction():
    """A second signature would compile (seconds) in the middle of a mission, at the first replan."""
    from flashrt_ros.runtime.engine import cpu_kernels

    s = Session(small_config(mixer="ssm"), backend="cpu")
    for o in observation_trace(20):
        s.step(o)
    s.replan(None, np.ones((3, 4, 14), np.float32))
    assert len(cpu_kernels.run_program.signatures) == 1
    assert cpu_kernels.run_program.targetoptions["nogil"]  # the live step and a replan can overlap


def test_a_forged_position_and_page_table_give_wrong_numbers_never_an_access_outside_the_arena():
    """Indices come from meta and kv_pages reduced modulo their extent, as in the CUDA kernels."""
    s = Session(small_config(), backend="cpu")
    for o in observation_trace(10):
        s.step(o)
    arena, before = s.arena, s.arena.state.copy()
    weights = s.arena.weight_slab.tobytes()
    arena["meta"][0] = [-(1 << 63), (1 << 63) - 1, -5, -(1 << 62), 0, 0, 0, 0]
    arena["kv_pages"][0] = [-(1 << 63), (1 << 63) - 1]
    arena["obs"][0] = 0.5
    s._live.replay()  # a crash here would take the test process with it
    assert arena.weight_slab.tobytes() == weights and arena.state[1:].tobytes() == before[1:].tobytes()


def test_warming_the_cpu_step_loads_the_compiled_kernels_only_for_a_backend_that_uses_them():
    from flashrt_ros.runtime.engine import cpu_backend
    from flashrt_ros.runtime.engine.backend import cuda_probe, warm_cpu_step
    assert warm_cpu_step("numpy") is None and warm_cpu_step("cuda") is None
    took = warm_cpu_step("cpu")
    assert took is not None and took >= 0 and cpu_backend.compile_seconds() == took
    assert (warm_cpu_step("auto") is None) == (cuda_probe() is None)  # auto: the CPU step only without CUDA


def test_the_compiled_sums_multiply_and_add_with_one_rounding():
    """fma32 (every product the compiled GEMVs and attention sum) rounds a * b + c once. a * b = 1 + 2^-11 +
    2^-24 needs one bit more than a float32 holds; rounded first, the 2^-24 is lost."""
    from numba import njit

    from flashrt_ros.runtime.engine.cpu_simd import fma32

    one_plus = np.float32(1 + 2.0 ** -12)
    fused = njit(lambda a, b, c: fma32(a, b, c))(one_plus, one_plus, np.float32(-1.0))
    assert fused == np.float32(2.0 ** -11 + 2.0 ** -24)
    assert one_plus * one_plus - np.float32(1.0) == np.float32(2.0 ** -11)  # two roundings: the case differs
