"""Works around eProsima/Fast-DDS#5053 (https://github.com/eProsima/Fast-DDS/issues/5053: no shared-memory traffic
after a process restarts: its zombie-port removal deletes a port others still write to, as the proposed fix
eProsima/Fast-DDS#4737 describes), seen with Fast DDS 2.6 and 2.14; off: the node's ``hold_dead_participant_ids`` false.

Keep a restarting node off the participant ids of Fast DDS processes that died (kill -9, a crash).

Fast DDS gives a new participant the lowest id whose metatraffic UDP port is free, so a node restarted on the
same computer takes its dead predecessor's id and the same shared-memory port (7411 + 250 * domain + 2 * id).
The processes that were sending to the dead node still have that port mapped. Normally their Fast DDS sees the
dead listener within a second or two and opens the port anew (which removes the dead listener's lock file,
``<port>_el``). When it does not, the lock file stays, unheld; the restarted node then takes the port for a
zombie, unlinks it and creates another, and those senders write into the old one for good: once in CI a
restarted primary heard nothing for 30 s, and a restarted pair of the stream bench was "discovered but does
not answer" for 90 s.

So before rclpy.init the node binds the metatraffic ports of those ids (UDP, loopback only, nothing is sent)
and lets go once its participant exists: Fast DDS then picks an id nobody died holding. ROS-free, tested
without a graph (and with real participants in test_dead_participants.py).
"""
from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from .shm_segments import NotRegularFile, open_regular

try:
    import fcntl
except ImportError:  # not POSIX: Fast DDS keeps its ports elsewhere there
    fcntl = None

SHM_DIR = Path("/dev/shm")
PORT_PREFIXES = ("fastdds", "fastrtps")  # Fast DDS 3 / 2.x (Humble, Jazzy)
PORT_BASE, DOMAIN_GAIN, PARTICIPANT_GAIN = 7400, 250, 2  # the RTPS port formula (Fast DDS's defaults)
METATRAFFIC_UNICAST, USER_UNICAST = 10, 11  # its offsets d1 and d3; user data's shared-memory port is d3's
MAX_IDS = 32  # the RMW's initial-peer range under ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST: ids past it are not
#               announced to, so held ids must leave room
MAX_DOMAIN_ID = 232  # the highest ROS_DOMAIN_ID whose ports fit the formula
MIN_AGE_S = 1.0  # a participant starting now creates its lock file an instant before it locks it


def metatraffic_port(domain_id: int, participant_id: int) -> int:
    return PORT_BASE + DOMAIN_GAIN * domain_id + METATRAFFIC_UNICAST + PARTICIPANT_GAIN * participant_id


def shm_port(domain_id: int, participant_id: int) -> int:
    return PORT_BASE + DOMAIN_GAIN * domain_id + USER_UNICAST + PARTICIPANT_GAIN * participant_id


def dead_participant_ids(domain_id: int, shm_dir: Path = SHM_DIR, min_age_s: float = MIN_AGE_S,
                         skipped: list[str] | None = None) -> list[int]:
    """Ids below MAX_IDS whose shared-memory port has a lock file nobody holds (its listener died and no sender
    has opened the port anew), ascending. All of them: Fast DDS takes the lowest free id, so any dead one left
    unheld below the first free id is taken (with only the 8 newest held, the 13th restart of the 20-kill resume
    test took an older one, and was "discovered but does not answer" for 60 s). Held ids above the first free
    one cost a socket each and move nothing; if every id below MAX_IDS is dead or live, the node gets one past
    them, as Fast DDS would give it anyway once they were live. A lock file that is not a regular file (a FIFO
    planted in /dev/shm, a link) is never opened, never waited on, and is named in ``skipped``."""
    if fcntl is None:
        return []
    found: list[int] = []
    now = time.time()
    for pid in range(MAX_IDS):
        port = shm_port(domain_id, pid)
        if port > 65535:
            break
        for prefix in PORT_PREFIXES:
            lock = shm_dir / f"{prefix}_port{port}_el"
            try:
                started = os.lstat(lock).st_mtime
                if now - started < min_age_s:
                    continue
                held = open_regular(lock)
                try:
                    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on close
                finally:
                    os.close(held)
            except NotRegularFile as e:
                if skipped is not None:
                    skipped.append(str(e))
                continue
            except OSError:
                continue  # absent, a link, or its listener lives
            found.append(pid)
            break
    return found


PORT_FILE = re.compile(r"^(?:sem\.)?(?:fastdds|fastrtps)_port(\d+)(?:_el|_sl|_mutex)?$")


def planted_port_files(domain_id: int, shm_dir: Path = SHM_DIR) -> list[str]:
    """Files named as Fast DDS names the shared-memory ports of ``domain_id`` (the port, its locks, its mutex)
    that are not regular files, sorted. Fast DDS opens them while the participant starts and waits for good on
    a FIFO (inside rclpy, where no signal handler runs); anyone can create files in /dev/shm. [] when none."""
    lo = PORT_BASE + DOMAIN_GAIN * domain_id
    planted = []
    try:
        entries = list(os.scandir(shm_dir))
    except OSError:
        return []
    for entry in entries:
        m = PORT_FILE.match(entry.name)
        if m is None or not lo <= int(m.group(1)) < lo + DOMAIN_GAIN:
            continue
        try:
            regular = entry.is_file(follow_symlinks=False)
        except OSError:
            continue
        if not regular:
            planted.append(entry.path)
    return sorted(planted)


def own_participant_ids(domain_id: int, fd_dir: Path = Path("/proc/self/fd"), shm_dir: Path = SHM_DIR) -> list[int]:
    """This process's participant ids in ``domain_id``: the ids whose shared-memory port lock file it has open
    and flock-held (its listeners; a sender's zombie check opens a peer's file for an instant, without keeping
    the lock), ascending; [] where /proc is not there. For the log: which id a restart took."""
    ids_in_domain = range(DOMAIN_GAIN // PARTICIPANT_GAIN)  # past it, the ports are the next domain's
    names = {f"{prefix}_port{shm_port(domain_id, pid)}_el": pid for pid in ids_in_domain for prefix in PORT_PREFIXES}
    found = set()
    try:
        links = list(fd_dir.iterdir())
    except OSError:
        return []
    for link in links:
        try:
            target = Path(os.readlink(link))
            if target.parent != shm_dir or target.name not in names:
                continue
            info = (fd_dir.parent / "fdinfo" / link.name).read_text()
        except OSError:
            continue  # closed meanwhile
        if any(line.startswith("lock:") and "FLOCK" in line for line in info.splitlines()):
            found.add(names[target.name])
    return sorted(found)


@dataclass
class HeldIds:
    """The metatraffic ports bound to keep Fast DDS off dead participants' ids; release() once the node's
    participant exists."""
    domain_id: int
    ids: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # lock files that are not regular files, never opened
    _sockets: list[socket.socket] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for s in self._sockets:
            s.close()
        self._sockets.clear()

    def line(self, own_ids: list[int] | None = None) -> str:
        """One line for the node's log: the id the participant took (``own_ids``) and the ids kept off ('' when
        neither is known)."""
        took = f"id {own_ids[0] if len(own_ids) == 1 else own_ids}, " if own_ids else ""
        if not self.ids:
            return f"DDS participant: {took[:-2]} of domain {self.domain_id}" if took else ""
        return (f"DDS participant: {took}kept off ids {self.ids} of domain {self.domain_id} (their processes died; "
                "processes that sent to them may still write to their shared-memory ports)")


def hold_dead_participant_ids(environ=os.environ, shm_dir: Path = SHM_DIR, hold: bool = True) -> HeldIds:
    """Bind the metatraffic port of every dead participant id of this process's domain (ROS_DOMAIN_ID) that
    nobody else binds. Anything that cannot be read or bound is left alone. ``hold`` False (the node's
    hold_dead_participant_ids): nothing is bound, only the domain is read."""
    try:
        domain_id = int(environ.get("ROS_DOMAIN_ID") or 0)
    except ValueError:
        return HeldIds(0)
    if not 0 <= domain_id <= MAX_DOMAIN_ID:  # rclpy refuses it anyway; its ports would be someone else's
        return HeldIds(domain_id)
    held = HeldIds(domain_id)
    if not hold:
        return held
    for pid in dead_participant_ids(domain_id, shm_dir, skipped=held.skipped):
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        except OSError:  # out of file descriptors: start on whatever id Fast DDS gives
            break
        try:
            s.bind(("127.0.0.1", metatraffic_port(domain_id, pid)))
        except OSError:
            s.close()  # taken: by a live participant, so Fast DDS skips it anyway
            continue
        held.ids.append(pid)
        held._sockets.append(s)
    return held


__all__ = ["PORT_PREFIXES", "HeldIds", "dead_participant_ids", "hold_dead_participant_ids", "metatraffic_port",
           "own_participant_ids", "planted_port_files", "shm_port"]
