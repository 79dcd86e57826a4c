"""A node restarted after a kill -9 keeps off the dead participant's id (flashrt_ros/ros/platform/dead_participants.py):
the lock files are read as Fast DDS leaves them, the ports are really bound, and a real restarted participant
takes another id."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from ros_harness import forget_dead_ports

from flashrt_ros.ros.platform.dead_participants import (
    MAX_IDS,
    dead_participant_ids,
    hold_dead_participant_ids,
    metatraffic_port,
    planted_port_files,
    shm_port,
)

DOMAIN = 100  # no run takes it (tests 1..19, runs 20..99), and its ports are below the ephemeral range


def _lock_file(shm_dir, participant_id: int, age_s: float = 10.0, prefix: str = "fastdds"):
    path = shm_dir / f"{prefix}_port{shm_port(DOMAIN, participant_id)}_el"
    path.touch()
    os.utime(path, (time.time() - age_s,) * 2)
    return path


def _bound_by_someone(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("127.0.0.1", port))
    except OSError as e:
        assert e.errno == errno.EADDRINUSE, e
        return True
    finally:
        s.close()
    return False


def test_only_unheld_lock_files_old_enough_are_dead_participants(tmp_path):
    _lock_file(tmp_path, 0)
    alive = _lock_file(tmp_path, 1)
    _lock_file(tmp_path, 2, age_s=0.0)  # a participant starting now: its file exists an instant before its lock
    _lock_file(tmp_path, 3, prefix="fastrtps")  # Fast DDS 2.x names
    (tmp_path / f"fastdds_port{shm_port(DOMAIN, 4)}").touch()  # a port without a lock file: opened anew
    (tmp_path / f"fastdds_port{shm_port(DOMAIN + 1, 5)}_el").touch()  # another domain
    with open(alive, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its listener lives
        assert dead_participant_ids(DOMAIN, tmp_path) == [0, 3]
    assert dead_participant_ids(DOMAIN, tmp_path) == [0, 1, 3]


def test_every_dead_id_below_the_peer_range_is_held_the_oldest_too(tmp_path):
    """Fast DDS takes the lowest free id: an old dead id left unheld is the one a restart takes (held were only
    the 8 newest once, and the 13th restart of 20 kills took an older one and never answered)."""
    for pid in range(MAX_IDS + 2):
        _lock_file(tmp_path, pid, age_s=100.0 - pid)  # higher ids died later
    assert dead_participant_ids(DOMAIN, tmp_path) == list(range(MAX_IDS))


def test_held_ids_bind_their_metatraffic_ports_until_released(tmp_path):
    _lock_file(tmp_path, 0)
    _lock_file(tmp_path, 2)
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", metatraffic_port(DOMAIN, 2)))  # a live process holds it: not ours to hold
    try:
        held = hold_dead_participant_ids({"ROS_DOMAIN_ID": str(DOMAIN)}, tmp_path)
        try:
            assert held.ids == [0]
            assert _bound_by_someone(metatraffic_port(DOMAIN, 0))
            assert f"kept off ids [0] of domain {DOMAIN}" in held.line()
        finally:
            held.release()
        assert not _bound_by_someone(metatraffic_port(DOMAIN, 0))
        held.release()  # twice is harmless
    finally:
        taken.close()


def test_own_ids_are_the_lock_files_this_process_holds_not_those_it_only_has_open(tmp_path):
    from flashrt_ros.ros.platform.dead_participants import own_participant_ids
    listener = _lock_file(tmp_path, 3, prefix="fastrtps")
    peer = _lock_file(tmp_path, 5)  # a sender's zombie check opens a peer's lock file for an instant
    other_domain = tmp_path / f"fastdds_port{shm_port(DOMAIN + 1, 0)}_el"
    other_domain.touch()
    with open(listener, "rb") as mine, open(peer, "rb"), open(other_domain, "rb") as theirs:
        fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(theirs, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert own_participant_ids(DOMAIN, shm_dir=tmp_path) == [3]
        assert own_participant_ids(DOMAIN + 1, shm_dir=tmp_path) == [0]
    assert own_participant_ids(DOMAIN, shm_dir=tmp_path) == []
    assert own_participant_ids(DOMAIN, fd_dir=tmp_path / "no-proc", shm_dir=tmp_path) == []


def test_the_log_line_names_the_id_taken_and_the_ids_kept_off():
    from flashrt_ros.ros.platform.dead_participants import HeldIds
    assert HeldIds(DOMAIN).line() == "" and HeldIds(DOMAIN).line([]) == ""
    assert HeldIds(DOMAIN).line([3]) == f"DDS participant: id 3 of domain {DOMAIN}"
    line = HeldIds(DOMAIN, ids=[0, 1]).line([3])
    assert line.startswith(f"DDS participant: id 3, kept off ids [0, 1] of domain {DOMAIN} (their processes died")
    assert HeldIds(DOMAIN, ids=[0]).line().startswith(f"DDS participant: kept off ids [0] of domain {DOMAIN}")


@pytest.mark.parametrize("domain", ["", "not-a-number", "-1", "233"])
def test_no_domain_or_a_bad_one_holds_nothing_it_cannot_name(tmp_path, domain):
    for d in (-1, 233):  # dead-looking files where an out-of-range domain's formula points
        lock = tmp_path / f"fastdds_port{shm_port(d, 0)}_el"
        lock.touch()
        os.utime(lock, (time.time() - 10,) * 2)
    held = hold_dead_participant_ids({"ROS_DOMAIN_ID": domain}, tmp_path)
    try:
        assert held.ids == [] and held.line() == "", held.ids
        assert domain != "" or held.domain_id == 0  # unset: ROS's default domain
    finally:
        held.release()


_PARTICIPANT = """
import json, os, sys, rclpy
from flashrt_ros.ros.platform.dead_participants import hold_dead_participant_ids, own_participant_ids
held = hold_dead_participant_ids() if sys.argv[1] == "hold" else None
rclpy.init()
node = rclpy.create_node("restarted")
if held is not None:
    held.release()
own = own_participant_ids(int(os.environ["ROS_DOMAIN_ID"]))
print(json.dumps({"held": held.ids if held is not None else None, "own": own}), flush=True)
sys.stdin.read()
"""


def _participant(env, mode: str) -> tuple[subprocess.Popen, dict]:
    """A process with one participant; its held ids (None when ``mode`` is "plain") and its own ids."""
    proc = subprocess.Popen([sys.executable, "-c", _PARTICIPANT, mode], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline().strip()
    try:
        return proc, json.loads(line)
    except ValueError:
        proc.kill()
        raise AssertionError(f"the participant did not start: {line}{proc.stdout.read()}") from None


def _close(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    try:
        proc.wait(15.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _killed_participant(env, domain: int) -> int:
    """A participant killed with SIGKILL once it is older than MIN_AGE_S: the dead id it leaves."""
    victim, first = _participant(env, "plain")
    time.sleep(1.2)  # older than MIN_AGE_S when it is read
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    dead = dead_participant_ids(domain)
    assert len(dead) == 1 and first["own"] == dead, (dead, first)  # nobody sent to it: its lock file stays
    return dead[0]


@pytest.mark.ros
def test_a_participant_restarted_after_a_kill_takes_a_fresh_id_only_when_it_holds_the_dead_one(ros_domain):
    domain = int(ros_domain["ROS_DOMAIN_ID"])
    forget_dead_ports(domain)
    # without holding it, Fast DDS gives a restart the dead id (the lowest free one). Checked first, right after the
    # kill: after a holding restart had announced itself to the dead id's port, a plain one once took another id
    # (Jazzy, a loaded CI run), which says nothing about the holding
    dead = _killed_participant(ros_domain, domain)
    port = metatraffic_port(domain, dead)
    plain, answer = _participant(ros_domain, "plain")
    try:
        assert _bound_by_someone(port), f"Fast DDS did not reuse the dead id {dead}: {answer}"
        assert answer["own"] == [dead], answer
    finally:
        plain.send_signal(signal.SIGKILL)  # dead again, at the same id
        plain.wait()
    time.sleep(1.2)  # its lock file older than MIN_AGE_S
    assert dead_participant_ids(domain) == [dead]
    restarted, answer = _participant(ros_domain, "hold")
    try:
        assert dead in answer["held"], answer
        assert not _bound_by_someone(port), "the restarted participant took the dead one's id"
        assert len(answer["own"]) == 1 and answer["own"] != [dead], answer
        assert _bound_by_someone(metatraffic_port(domain, answer["own"][0])), answer  # the id it reports is its own
    finally:
        _close(restarted)


@pytest.mark.ros
def test_a_node_started_after_a_kill_keeps_off_the_dead_id_and_says_so(ros_domain, tmp_path):
    from ros_harness import NodeProcess
    domain = int(ros_domain["ROS_DOMAIN_ID"])
    forget_dead_ports(domain)
    victim, _ = _participant(ros_domain, "plain")
    time.sleep(1.2)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    dead = dead_participant_ids(domain)
    assert len(dead) == 1, dead  # the killed participant's
    node = NodeProcess(ros_domain, tmp_path / "node.log")
    try:
        end = time.monotonic() + 60.0
        while "DDS participant:" not in node.output() and "activate:" not in node.output():
            assert time.monotonic() < end and node.proc.poll() is None, node.output()[-3000:]
            time.sleep(0.1)
        held = [ln for ln in node.output().splitlines() if "DDS participant: id " in ln]
        assert held and f"kept off ids {dead} of domain {domain}" in held[0], node.output()[-3000:]
        took = held[0].split("DDS participant: id ")[1].split(",")[0]
        assert took.isdigit(), held[0]  # one id, not a list: the node has one participant
        took = int(took)
        assert took not in dead and _bound_by_someone(metatraffic_port(domain, took)), held[0]
    finally:
        node.stop()


def test_a_fifo_at_a_port_lock_name_is_skipped_never_opened_and_named(tmp_path):
    """Issue 44.4: a FIFO planted in /dev/shm at a port's lock file name hung the node's start-up for good (the
    scan opened it, waiting for a writer), before rclpy was even started."""
    from test_shm_segments import _never_blocks, _unblock
    _lock_file(tmp_path, 0)
    fifo = tmp_path / f"fastdds_port{shm_port(DOMAIN, 1)}_el"
    os.mkfifo(fifo)
    os.utime(fifo, (0, 0))
    (tmp_path / f"fastdds_port{shm_port(DOMAIN, 2)}_el").symlink_to(tmp_path / "elsewhere")
    _lock_file(tmp_path, 3)
    skipped = []
    try:
        ended, ids = _never_blocks(dead_participant_ids, DOMAIN, tmp_path, skipped=skipped)
    finally:
        _unblock(fifo)
    assert ended, "dead_participant_ids waited on the FIFO"
    assert ids == [0, 3] and skipped == [f"{fifo} is a FIFO"]


def test_files_planted_at_this_domains_port_names_are_found_others_not(tmp_path):
    """Fast DDS itself waits on a FIFO at its port's lock name, inside rclpy where no signal handler runs: the
    node refuses to start on them (node.main), naming them."""
    port = shm_port(DOMAIN, 5)
    for name in (f"fastdds_port{port}_el", f"fastrtps_port{port}", f"sem.fastdds_port{port}_mutex"):
        os.mkfifo(tmp_path / name)
    (tmp_path / f"fastdds_port{port + 2}_sl").symlink_to(tmp_path / "x")  # a link: also not a regular file
    os.mkfifo(tmp_path / f"fastdds_port{shm_port(DOMAIN + 1, 5)}_el")  # another domain's: not ours to refuse
    os.mkfifo(tmp_path / "fastdds_0123456789abcdef_el")  # a segment's: the scan skips it (no Fast DDS open)
    _lock_file(tmp_path, 6)  # a regular one
    assert planted_port_files(DOMAIN, tmp_path) == sorted(
        str(tmp_path / n) for n in (f"fastdds_port{port}_el", f"fastrtps_port{port}", f"sem.fastdds_port{port}_mutex",
                                    f"fastdds_port{port + 2}_sl"))
    assert planted_port_files(DOMAIN, tmp_path / "absent") == []
