"""`make mutate` is not part of `make test`, so its list must not go stale unseen: every mutation's snippet
is in its file exactly once (a change elsewhere in the code must carry its mutations along)."""
from __future__ import annotations

import pytest
from mutations import MUTATIONS

from conftest import ROOT


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_every_mutation_breaks_exactly_one_place_in_todays_code(mutation):
    text = (ROOT / mutation.file).read_text()
    assert text.count(mutation.old) == 1, f"{mutation.file}: the snippet is there {text.count(mutation.old)} times"
    assert mutation.new != mutation.old


def test_mutation_names_are_unique():
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names))
