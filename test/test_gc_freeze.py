"""gc_freeze_period_s: the long-lived objects leave the collector's generations, and nothing stays alive that
should not (frozen objects still die by reference count; cycles that were garbage at the freeze are collected)."""
from __future__ import annotations

import gc
import weakref

import pytest

from flashrt_ros.ros.platform.gc_freeze import collect_and_freeze, thaw


class Record:  # a capsule record's shape: plain attributes, no cycle
    def __init__(self, i: int):
        self.i, self.label = i, f"capsule {i}"


@pytest.fixture
def frozen():
    yield
    gc.unfreeze()


def test_frozen_survivors_are_never_walked_again_and_still_die_by_refcount(frozen):
    store = [Record(i) for i in range(5000)]
    collect_and_freeze()
    tracked = {id(o) for g in range(3) for o in gc.get_objects(generation=g)}
    assert not any(id(r) in tracked for r in store), "a full collection would walk the frozen records again"
    assert gc.get_freeze_count() >= len(store)
    probe = weakref.ref(store[0])
    del store[0]  # evicted: freed at once, frozen or not
    assert probe() is None


def test_a_cycle_that_was_garbage_at_the_freeze_is_collected_not_frozen(frozen):
    a, b = Record(1), Record(2)
    a.other, b.other = b, a
    probe = weakref.ref(a)
    del a, b
    collect_and_freeze()
    assert probe() is None


def test_a_cycle_frozen_while_alive_is_collected_once_thawed(frozen):
    a, b = Record(1), Record(2)  # a session and its tap, say
    a.other, b.other = b, a
    probe = weakref.ref(a)
    collect_and_freeze()
    del a, b  # released at cleanup: garbage, but frozen
    gc.collect()
    assert probe() is not None  # what a freeze costs: the collector never sees it
    thaw()
    assert probe() is None
