"""Every output byte of a fixed run is what it was on c220c38, before the one-model redesign (issue 16):
actions, chunks, capsules, the exported file, replan (with and without commit) and cold prefill, for the
default config and two small ones (a wrapping window, exploration noise). test/golden_run.py
says how the hashes are made and how to regenerate them for an intended change."""
import json

import pytest
from golden_run import GOLDEN, RUNS, golden_run

WANT = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(RUNS))
def test_fixed_run_is_byte_identical_to_the_checked_in_hashes(name):
    changes, steps = RUNS[name]
    got = golden_run(changes, steps)
    assert set(got) == set(WANT[name])
    changed = sorted(k for k in got if got[k] != WANT[name][k])
    assert not changed, f"{name}: these outputs changed bytes: {changed}"
