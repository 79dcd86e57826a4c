"""A pin is a promise to keep a capsule: drop_capsule refuses a pinned one (unpin it first), over the
service of a real node process, and the refusal changes nothing."""
import pytest
from replan_helpers import live_sha

from conftest import observation_trace

pytestmark = pytest.mark.ros


def test_a_pinned_capsule_that_is_not_live_is_not_dropped_until_it_is_unpinned(flashrt):
    _, planner = flashrt
    obs = observation_trace(20)
    planner.run(obs[:10])
    by_set_pin = planner.steps[4].capsule_id
    assert planner.client.set_pin(by_set_pin, True).success
    by_snapshot = planner.client.snapshot(label="before_grasp", pin=True).capsule.id
    planner.run(obs[10:12])  # neither is live now
    listed = planner.client.list_capsules()
    assert listed.live_capsule_id not in (by_set_pin, by_snapshot)
    sha = live_sha(planner, "before")
    before = [(c.id, c.pinned) for c in planner.client.list_capsules().capsules]
    for cid in (by_set_pin, by_snapshot):
        r = planner.client.drop_capsule(cid)
        assert not r.success and f"capsule {cid} is pinned" in r.message and "unpin it first" in r.message, r.message
    after = [(c.id, c.pinned) for c in planner.client.list_capsules().capsules]
    assert after == before and live_sha(planner, "after") == sha
    # unpinned, it can go
    assert planner.client.unpin(by_set_pin).success
    assert planner.client.drop_capsule(by_set_pin).success
    assert by_set_pin not in [c.id for c in planner.client.list_capsules().capsules]
    assert [c.id for c in planner.client.list_capsules(pinned_only=True).capsules] == [by_snapshot]
