"""Every output byte of a fixed run is what it was on c220c38, before the one-model redesign (issue 16), but for the
seeded weights becoming bf16 values on 2026-12-05 (the hashes recomputed then):
actions, chunks, capsules, the exported file, replan (with and without commit) and cold prefill, for the
default config and two small ones (a wrapping window, exploration noise). test/golden_run.py
says how the hashes are made and how to regenerate them for an intended change."""
import json

import numpy as np
import pytest
from golden_run import GOLDEN, RUNS, blas_core, golden_run

WANT = json.loads(GOLDEN.read_text())
# Cold prefill runs multi-row GEMMs through numpy's BLAS, whose blocking (so its rounding) changes with the
# numpy/OpenBLAS build: its bytes are fixed per build, not across them. The runs' own hashes are from the
# dev venv (constraints.txt); other builds' prefill hashes, computed with them, are listed by numpy version,
# or by numpy version and OpenBLAS kernel family where that family rounds differently (numpy 1.26.4's 'Zen',
# found on an AMD EPYC: its small GEMMs differ from the Intel machine the plain entry was computed on).
# OpenBLAS's AVX-512 families ('SkylakeX', 'Cooperlake') round the step's GEMVs differently from the AVX2 ones
# the plain entries come from, so every output differs there: their whole runs, computed with numpy 1.26.4 and
# 2.4.6 (identical on both; 2.4.6's OpenBLAS has no Cooperlake kernels), are listed by family.
# A null hash was not recorded for that build: the policy file format (2026-12-07) changed the exported file's
# header, whose bytes beside it (the state) are per build; `golden_run.py --write` on that build records it.


@pytest.mark.parametrize("name", sorted(RUNS))
def test_fixed_run_is_byte_identical_to_the_checked_in_hashes(name):
    changes, steps = RUNS[name]
    got = golden_run(changes, steps)
    core = blas_core()
    want = dict(WANT["runs_by_blas_core"].get(core, WANT)[name])
    builds = WANT["prefill_state_by_numpy"]
    other_build = builds.get(f"{np.__version__} {core}", builds.get(np.__version__))
    if other_build is not None and core not in WANT["runs_by_blas_core"]:
        want["prefill_state"] = other_build[name]
    assert set(got) == set(want)
    unrecorded = sorted(k for k in want if want[k] is None)
    assert len(unrecorded) <= 1, f"{name}: only the exported file may be unrecorded, not {unrecorded}"
    changed = sorted(k for k in got if want[k] is not None and got[k] != want[k])
    assert not changed, (f"{name}: these outputs changed bytes on numpy {np.__version__}, OpenBLAS core "
                         f"'{core}': {changed} (a build not yet listed: see test/golden_run.py)")
