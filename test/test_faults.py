"""Faults a client or the machine can cause: every service answers success=false with a clear
message, the node keeps stepping, and the live state is what a reference Session says it must be."""
import os
import resource
import signal
import subprocess
import time

import numpy as np
import pytest
from ros_harness import NodeProcess, Planner, call, env_without_module, reference_session, spin_until, stamp_ns

from conftest import observation_trace

pytestmark = pytest.mark.ros

FILE_SIZE_LIMIT = 256 * 1024  # a capsule file of the FAST node is ~1 MiB: every export hits the limit


def limit_file_size():
    """In the node process: writes past FILE_SIZE_LIMIT fail with EFBIG, as on a full disk (the signal
    that would otherwise kill the process is ignored, as a daemon would)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def start(ros_domain, tmp_path, env=None, preexec_fn=None, **params):
    params.setdefault("replan_max_deadline_ms", 60_000.0)  # these tests need replans that run for seconds
    proc = NodeProcess(env or ros_domain, tmp_path / "node.log", capsule_dir=str(tmp_path / "capsules"),
                       preexec_fn=preexec_fn, **params)
    planner = Planner()
    try:
        planner.wait_ready()
    except BaseException:  # a node that never got ready must not run on into the next tests
        planner.close()
        proc.stop()
        raise
    return proc, planner


def start_long_replan(planner, client, obs0, horizon: int):
    """Send an 8-branch replan of ``horizon`` steps and wait until it runs (its first feedback).
    Returns (goal handle, feedback list)."""
    from flashrt_interfaces.action import Replan

    feedback = []
    goal = Replan.Goal(branches=8, horizon=horizon, observations=np.tile(obs0, 8 * horizon).tolist(),
                       commit_branch=-1, deadline_ms=60_000.0)
    handle = spin_until(planner.node, client.send_goal_async(goal, feedback_callback=feedback.append))
    assert handle.accepted
    end = time.monotonic() + 10
    while not feedback and time.monotonic() < end:
        planner.spin(0.01)
    assert feedback, "the replan never started"
    return handle, feedback


def stop(proc, planner):
    planner.close()
    rc = proc.stop()
    out = proc.output()
    assert "Traceback" not in out, out[-3000:]
    assert rc == 0, f"node exited with {rc}:\n{out[-3000:]}"
    return out


def export(planner, name, capsule_id=0):
    from flashrt_interfaces.srv import ExportCapsule
    return call(planner, ExportCapsule, "export_capsule", capsule_id=capsule_id, file_name=name)


def import_(planner, name, restore=False):
    from flashrt_interfaces.srv import ImportCapsule
    return call(planner, ImportCapsule, "import_capsule", file_name=name, restore=restore)


class Reference:
    """Steps a reference Session with every observation the node accepted, and checks the node's
    action bytes against it: any change of the node's live state shows up as a different action."""

    def __init__(self, planner, **params):
        self.planner, self.session = planner, reference_session(**params)

    def step(self, obs):
        got = self.planner.step(obs)
        want = self.session.step(obs)
        assert np.asarray(got.action, np.float32).tobytes() == want.action.tobytes(), "live state diverged"
        assert got.step == want.step
        return got


def mount_read_only_over(path) -> bool:
    """A read-only tmpfs over `path` (needs mount rights: root in a container that allows it)."""
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k,mode=0700", "tmpfs", str(path)],
                       capture_output=True)
    return r.returncode == 0


def test_file_system_faults_and_bad_names_are_answered_and_the_node_keeps_stepping(ros_domain, tmp_path):
    proc, planner = start(ros_domain, tmp_path, preexec_fn=limit_file_size)
    capsules = tmp_path / "capsules"
    ref = Reference(planner)
    obs = observation_trace(60)
    try:
        for o in obs[:10]:
            ref.step(o)
        bad = {
            "a" * 300: "at most 128",  # once ENAMETOOLONG from the file system: refused up front now
            "line\nbreak": "contains",
            "a/b": "contains '/'",
            ".": "must not start with '.'",
            "..": "must not start with '.'",
            ".hidden": "must not start with '.'",
            "": "empty",
        }
        for name, why in bad.items():
            r = export(planner, name)
            assert not r.success and why in r.message, (name, r.message)
        r = export(planner, "full.safetensors")  # EFBIG: the disk is "full"
        assert not r.success and "File too large" in r.message, r.message
        assert capsules.is_dir() and (capsules.stat().st_mode & 0o777) == 0o700
        assert sorted(os.listdir(capsules)) == [], "a failed export left a file behind"
        # a symbolic link planted in capsule_dir is refused both ways
        outside = tmp_path / "outside.safetensors"
        (capsules / "link.safetensors").symlink_to(outside)
        r = export(planner, "link.safetensors")
        assert not r.success and "symbolic link" in r.message and not outside.exists()
        ref.session.export_capsule(5, outside)  # a valid capsule, outside the directory
        r = import_(planner, "link.safetensors", restore=True)
        assert not r.success and "symbolic link" in r.message
        os.mkfifo(capsules / "fifo.safetensors")  # would block a reader that opens it blindly
        r = import_(planner, "fifo.safetensors")
        assert not r.success and "not a regular file" in r.message
        if os.geteuid() == 0:  # a directory another user owns is refused
            os.chown(capsules, 65534, 65534)
            try:
                r = export(planner, "owned.safetensors")
                assert not r.success and "owned by uid 65534" in r.message
            finally:
                os.chown(capsules, 0, 0)
            ro = tmp_path / "capsules"
            if mount_read_only_over(ro):
                try:
                    r = export(planner, "ro.safetensors")
                    assert not r.success and "Read-only file system" in r.message, r.message
                finally:
                    subprocess.run(["umount", str(ro)], check=True)
        for o in obs[10:20]:
            ref.step(o)
    finally:
        out = stop(proc, planner)
    assert "export_capsule failed" in out


def test_hostile_capsules_and_labels_are_refused_and_pins_never_starve_the_live_step(ros_domain, tmp_path):
    from capsule_craft import HOSTILE, craft

    from flashrt_interfaces.srv import ListCapsules, SetPin, Snapshot

    proc, planner = start(ros_domain, tmp_path, capsule_capacity=16, max_branches=2)
    capsules = tmp_path / "capsules"
    ref = Reference(planner, capsule_capacity=16, max_branches=2)
    obs = observation_trace(80)
    try:
        for o in obs[:10]:
            ref.step(o)
        capsules.mkdir(mode=0o700)
        good = capsules / "good.safetensors"
        ref.session.export_capsule(8, good)  # same config, weights and plan: the node accepts it
        for case, kw in HOSTILE.items():
            craft(good, capsules / f"{case}.safetensors", **kw)
            r = import_(planner, f"{case}.safetensors", restore=True)
            assert not r.success and ("bad metadata" in r.message or "non-finite" in r.message), (case, r.message)
        ref.step(obs[10])  # live state untouched by every refusal
        live = call(planner, ListCapsules, "list_capsules").live_capsule_id
        t0 = time.monotonic()
        for _ in range(1000):  # failed imports take no slot
            assert not import_(planner, "step_string.safetensors").success
        elapsed = time.monotonic() - t0
        after = ref.step(obs[11])
        assert after.capsule_id > live, "the live step took no capsule after the failed imports"
        ok = import_(planner, "good.safetensors")  # the control: crafting alone breaks nothing
        assert ok.success and ok.capsule.step == 8, ok.message
        # labels are bounded
        r = call(planner, Snapshot, "snapshot", label="x" * 257)
        assert not r.success and "256" in r.message
        # pin until the node refuses; the live step still takes a capsule; unpin frees room
        pinned = []
        for _ in range(16):
            r = call(planner, Snapshot, "snapshot", label="keep", pin=True)
            if not r.success:
                break
            pinned.append(r.capsule.id)
        assert pinned and not r.success and "pin" in r.message, r.message
        for o in obs[12:40]:
            assert ref.step(o).capsule_id > 0
        lst = call(planner, ListCapsules, "list_capsules", pinned_only=True)
        assert lst.success and sorted(c.id for c in lst.capsules) == pinned
        r = call(planner, SetPin, "set_pin", capsule_id=pinned[0], pin=False)
        assert r.success and not r.capsule.pinned and r.capsule.id == pinned[0]
        r = call(planner, SetPin, "set_pin", capsule_id=after.capsule_id + 1000, pin=True)
        assert not r.success and "unknown" in r.message
        r = call(planner, SetPin, "set_pin", capsule_id=ref.step(obs[40]).capsule_id, pin=True)
        assert r.success and r.capsule.pinned
    finally:
        stop(proc, planner)
    print(f"1000 failed imports over ROS: {elapsed:.1f} s")


def test_without_safetensors_export_fails_cleanly_and_sigint_during_a_replan_exits_quietly(ros_domain, tmp_path):
    from rclpy.action import ActionClient

    from flashrt_interfaces.action import Replan

    env = env_without_module(ros_domain, tmp_path / "shim", "safetensors")
    proc, planner = start(ros_domain, tmp_path, env=env)
    ref = Reference(planner)
    obs = observation_trace(20)
    try:
        for o in obs[:5]:
            ref.step(o)
        for r in (export(planner, "a.safetensors"), import_(planner, "a.safetensors")):
            assert not r.success and "module 'safetensors' is not installed" in r.message, r.message
        for o in obs[5:10]:
            ref.step(o)
        # a replan long enough to be running when SIGINT arrives
        client = ActionClient(planner.node, Replan, "/test/replan")
        assert client.wait_for_server(timeout_sec=10)
        # long enough to be running when the signal lands, short enough to end within the 5 s the
        # replan server waits for its worker at shutdown, even on a busy machine
        start_long_replan(planner, client, obs[0], 300)
        before = len(proc.output())
        proc.proc.send_signal(signal.SIGINT)
        rc = proc.proc.wait(20)
    finally:
        planner.close()
        proc.stop()
    out = proc.output()
    assert rc == 0, out[-3000:]
    assert "Traceback" not in out and "ERROR" not in out[before:], out[-3000:]


def test_a_service_waiting_for_the_runtime_lock_delays_no_cancel_and_survives_a_deactivate(ros_domain, tmp_path):
    from action_msgs.msg import GoalStatus
    from lifecycle_msgs.msg import Transition
    from rclpy.action import ActionClient
    from std_srvs.srv import Trigger
    from test_ros_lifecycle import change_state, get_state

    from flashrt_interfaces.action import Replan
    from flashrt_interfaces.srv import Snapshot

    proc, planner = start(ros_domain, tmp_path)
    obs = observation_trace(10)
    try:
        planner.run(obs)
        client = ActionClient(planner.node, Replan, "/test/replan")
        assert client.wait_for_server(timeout_sec=10)
        handle, feedback = start_long_replan(planner, client, obs[0], 3000)
        snap_cli = planner.node.create_client(Snapshot, "/test/snapshot")
        reset_cli = planner.node.create_client(Trigger, "/test/reset")
        assert reset_cli.wait_for_service(timeout_sec=10)
        waiting = reset_cli.call_async(Trigger.Request())  # a reset waits for a running replan
        planner.spin(0.2)  # the request is in the node and waiting
        t0 = time.monotonic()
        cancel = spin_until(planner.node, handle.cancel_goal_async(), 20)
        cancel_s = time.monotonic() - t0
        result = spin_until(planner.node, handle.get_result_async(), 20)
        # Blocked behind the reset, the cancel would only be seen after the whole horizon had run: the
        # goal would have succeeded, and the cancel been refused. Timing is reported, not asserted.
        assert cancel.return_code == 0, f"cancel refused after {cancel_s:.1f} s"
        assert result.status == GoalStatus.STATUS_CANCELED
        assert len(result.result.actions) < 8 * 3000 * 7
        r = spin_until(planner.node, waiting, 20)
        assert r.success, r.message
        # deactivating while a call waits for the lock: the call is dropped with its service, the node
        # lives on and comes back
        # (short enough to end within the 5 s the replan server waits for its worker, even on a busy machine)
        handle, feedback = start_long_replan(planner, client, obs[0], 400)
        snap_cli.call_async(Snapshot.Request(label="in flight at deactivate"))
        planner.spin(0.1)
        assert change_state(planner, Transition.TRANSITION_DEACTIVATE)
        planner.spin(1.0)  # the replan ends, the waiting call completes on its worker
        assert get_state(planner) == "inactive" and proc.proc.poll() is None
        assert change_state(planner, Transition.TRANSITION_ACTIVATE)
        planner.wait_ready()
        first = planner.step(obs[0]).step
        assert planner.step(obs[1]).step == first + 1
        assert call(planner, Snapshot, "snapshot", label="after").success
    finally:
        out = stop(proc, planner)
    assert "ERROR" not in out, out[-3000:]  # e.g. a response sent on the destroyed service


@pytest.mark.serial  # a 100 Hz stream against a replan's run time
def test_a_100_hz_stream_is_stepped_and_published_during_a_long_replan_in_order_and_none_lost(ros_domain, tmp_path):
    from action_msgs.msg import GoalStatus
    from rclpy.action import ActionClient
    from ros_harness import joint_state

    from flashrt_interfaces.action import Replan

    # keep_all: the test is about the replan never holding the executor back (every step published while it
    # still runs), not about the depth-8 queue when the whole 2-core machine starves the node for 100+ ms
    # (11 of 30 lost that way once in a full Jazzy suite; not seen in 15 runs alone beside two busy loops)
    proc, planner = start(ros_domain, tmp_path, backend="cpu",  # the default: its replay releases the GIL
                          **{"qos_overrides./test/observation.subscription.history": "keep_all"})
    n = 30
    obs = observation_trace(5 + n)
    try:
        planner.run(obs[:5])
        client = ActionClient(planner.node, Replan, "/test/replan")
        assert client.wait_for_server(timeout_sec=10)
        handle, feedback = start_long_replan(planner, client, obs[0], 20_000)  # runs for many seconds
        result = handle.get_result_async()
        stamps = [planner.stamp + 10_000_000 * (k + 1) for k in range(n)]
        for k, stamp in enumerate(stamps):  # 100 Hz
            planner.publish(joint_state(obs[5 + k], stamp))
            planner.spin(0.01)
        end = time.monotonic() + 30
        while len(planner.steps) < 5 + n and time.monotonic() < end and not result.done():
            planner.spin(0.01)
        # every observation's policy_step arrived while the replan was still running
        stepped = {stamp_ns(m) for m in planner.steps[5:]}
        assert not result.done(), (f"the replan ended first: {len(stepped)} of {n} observations stepped by then, "
                                   f"missing {[k for k, s in enumerate(stamps) if s not in stepped]}; node log: "
                                   f"{proc.output()[-1500:]}")
        assert feedback[-1].feedback.steps_done < 20_000
        got = [stamp_ns(m) for m in planner.steps[5:]]
        assert got == stamps and [m.step for m in planner.steps[5:]] == list(range(6, 6 + n))
        spin_until(planner.node, handle.cancel_goal_async(), 20)
        assert spin_until(planner.node, result, 20).status == GoalStatus.STATUS_CANCELED
    finally:
        stop(proc, planner)
