"""Persistence and exports against real signals and real write failures, in child processes.

A SIGKILL in the middle of an export never leaves a partial file under the final name; a full disk
(a file-size limit, so writes fail with EFBIG) costs records, never steps, and the log recovers when
space returns.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import numpy as np

from conftest import ROOT, observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.attach import layout_of
from flashrt_ros.runtime.persist.format import iter_segment_paths, scan
from flashrt_ros.runtime.persist.resume import meta_reader
from flashrt_ros.runtime.persist.writer import PersistSettings

KILLS = 20


def child(script: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


# ---- kill -9 during an export ----------------------------------------------------------------
# Steps and exports forever: the live capsule to the same final name, then to a new one; after each
# export completes it writes "<name> <step>" in one write: with PYTHONUNBUFFERED (set by other tests' harness)
# print() makes a write per piece, and a kill between them left a line without its step.
EXPORT_CHILD = r"""
import json, sys
from pathlib import Path
import numpy as np
from flashrt_ros.runtime import PolicyConfig, Session
cfg = PolicyConfig(**json.loads(sys.argv[1]))
out, tag = Path(sys.argv[2]), int(sys.argv[3])
s = Session(cfg)
rng = np.random.default_rng(tag)
def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
k = 0
while True:
    s.step(rng.standard_normal(cfg.obs_dim).astype(np.float32))
    s.export_capsule(0, out / "same.cap")
    say(f"same.cap {s.step_count}")
    if k == 0:
        say("ready")  # after the first step and export: the kill's delay then falls in the loop, not the warm-up
    name = f"new-{tag}-{k}.cap"
    s.export_capsule(0, out / name)
    say(f"{name} {s.step_count}")
    k += 1
"""
FINAL = re.compile(r"^(same|new-\d+-\d+)\.cap$")
TEMP = re.compile(r"^\.((?:same|new-\d+-\d+)\.cap)\.(\d+)\.tmp$")  # write_capsule_file's temporary name


def export_config():
    # a 4096-step window at d_model 64: each capsule file holds ~4 MB of KV, so a write takes a while
    return small_config(kv_window=4096, d_model=64, capsule_capacity=16, capsule_budget_mb=64.0)


def test_kill_9_during_exports_never_leaves_a_partial_file_under_a_final_name(tmp_path):
    cfg = export_config()
    checker = Session(cfg)  # same config and seed: the same fingerprint as the child's
    rng = np.random.default_rng(7)
    temps_left = 0
    for tag in range(3 * KILLS):  # KILLS at least; more until one has landed inside a write (a few % of them do)
        if tag >= KILLS and temps_left >= 1:
            break
        proc = child(EXPORT_CHILD, json.dumps(asdict(cfg)), str(tmp_path), str(tag))
        first = proc.stdout.readline()  # the first export's line, then "ready"
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err
        done: dict[str, int] = {}  # name -> step of its last completed export
        for line in [first, *out.splitlines()]:
            name, step = line.split()
            done[name] = int(step)
        for path in sorted(tmp_path.iterdir()):
            if TEMP.match(path.name):
                # a write the kill interrupted: hidden, named for the child that wrote it, never final
                assert int(TEMP.match(path.name)[2]) == proc.pid, path.name
                temps_left += 1
                path.unlink()
                continue
            assert FINAL.match(path.name), f"unexpected file {path.name}"
            info = checker.store.read_file(path).info  # validates every byte (checksums, meta, shapes)
            if path.name in done:  # completed before the kill: that file, or the next export's
                assert info["step"] in (done[path.name], done[path.name] + 1), (path.name, info["step"])
            if path.name != "same.cap":
                path.unlink()  # keep the directory small; same.cap carries over to the next child
        for name in done:
            assert name == "same.cap" or name.startswith("new-"), name
    # the kills landed inside writes (between the temporary's creation and its rename) at least once,
    # so the loop above did check the moment that matters
    assert temps_left >= 1


# ---- a full disk -----------------------------------------------------------------------------
# Steps with persistence in three phases of 60 steps: no limit, a file-size limit just above the
# newest segment's size (the next record is cut short, then writes fail with EFBIG), the limit raised
# again. Prints the stats after each phase as JSON lines and writes the live state's bytes.
FULL_DISK_CHILD = r"""
import json, resource, signal, sys
from dataclasses import asdict
from pathlib import Path
import numpy as np
from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.persist.writer import MB, PersistSettings
from flashrt_ros.runtime.persist.format import iter_segment_paths
cfg = PolicyConfig(**json.loads(sys.argv[1]))
log_dir, state_out = Path(sys.argv[2]), Path(sys.argv[3])
obs = np.load(sys.argv[4])
segment_mb = 0.05
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() fails with EFBIG instead
s = Session(cfg)
s.enable_persistence(PersistSettings(log_dir, fsync_every_ms=0.0, segment_mb=segment_mb, budget_mb=64.0))
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)

def phase(name, lo, hi):
    for o in obs[lo:hi]:
        s.step(o)
    assert s.persistence.flush()
    print(json.dumps({"phase": name, "step": s.step_count, **asdict(s.persistence.stats())}), flush=True)

phase("before", 0, 60)
newest = list(iter_segment_paths(log_dir))[-1].stat().st_size
# a little room in the newest segment, and less than a segment: the next record is torn by the limit
limit = min(newest + 100, int(segment_mb * MB) - 1)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
phase("full", 60, 120)
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
phase("after", 120, 180)
s.disable_persistence()
state_out.write_bytes(s.state_host().tobytes())
"""


def test_a_full_disk_drops_records_not_steps_and_the_log_recovers_byte_exactly(tmp_path):
    cfg = small_config()
    obs = observation_trace(180)
    np.save(tmp_path / "obs.npy", obs)
    log_dir, state_out = tmp_path / "log", tmp_path / "state.bin"
    proc = child(FULL_DISK_CHILD, json.dumps(asdict(cfg)), str(log_dir), str(state_out), str(tmp_path / "obs.npy"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    before, full, after = (json.loads(line) for line in out.splitlines())

    # no limit: every record written, the log rotated
    assert before["step"] == 60 and before["records_written"] == 60 and before["write_errors"] == 0
    assert before["segments"] >= 2
    # the disk is full: every step still ran, and each record that did not fit is counted
    assert full["step"] == 120
    assert full["write_errors"] >= 1 and "File too large" in full["last_error"]
    assert full["records_dropped"] - before["records_dropped"] == full["write_errors"]  # lost to the disk only
    assert full["records_written"] - before["records_written"] + full["write_errors"] == 60
    assert full["queue_records"] == 0 and full["queue_bytes"] == 0
    # space returns: every record is written again, the first of them a RESYNC
    assert after["step"] == 180 and after["write_errors"] == full["write_errors"]
    assert after["records_written"] - full["records_written"] == 60
    assert after["resyncs_written"] > full["resyncs_written"]
    assert after["segments"] > full["segments"]

    # the log resumes to the child's live state, which equals a run that never persisted anything
    live = state_out.read_bytes()
    resumed = Session(cfg)
    report = resumed.enable_persistence(PersistSettings(log_dir, fsync_every_ms=0.0, segment_mb=0.05,
                                                        budget_mb=64.0), resume=True)
    resumed.disable_persistence()
    assert (report.step, report.records_cut) == (180, 0), report.summary()
    assert resumed.state_host().tobytes() == live
    reference = Session(cfg)
    for o in obs:
        reference.step(o)
    assert reference.state_host().tobytes() == live
    # no segment holds a torn or zero-filled stretch (resume may not read back that far): every one
    # scans cleanly to its end, and the records of all of them are the 180 written, in order
    steps = []
    for seg in iter_segment_paths(log_dir):
        recs, bad = scan(seg, seg.read_bytes(), layout_of(resumed), meta_reader(resumed.arena))
        assert bad is None, bad
        steps += [r.step for r in recs]
    assert len(steps) == after["records_written"] and steps == sorted(steps) and steps[-1] == 180
