"""Capsule files from outside are validated completely before they touch anything: size, kind of file,
header, format version, fingerprint, a checksum over metadata and data, every info field, the meta
invariants and finiteness. Crafted files carry a *valid* checksum: the checks behind it must hold."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save

from conftest import assert_refused_unchanged, observation_trace
from flashrt_ros.runtime import CorruptCapsule
from flashrt_ros.runtime.model.kernels import META_KV_LEN, META_POS, META_STEP
from flashrt_ros.runtime.state.capsule_file import FORMAT, _digest, state_digest


def refused(s, fn, match):
    assert_refused_unchanged(s, fn, CorruptCapsule, match)


def craft(path, s, tensors=None, info=None, fmt=FORMAT):
    """A capsule file whose checksum matches whatever it holds."""
    payload = s.materialize(s.live_capsule_id)
    tensors = {**payload, **(tensors or {})}
    base = {"id": 30, "parent_id": 29, "step": 30, "stamp_ns": 0, "label": "", "pinned": False, "nbytes": 1,
            "fingerprint": s.fingerprint}
    info_text = info if isinstance(info, str) else json.dumps({**base, **(info or {})})
    meta = {"format": fmt, "info": info_text, "fingerprint": s.fingerprint, "state_sha256": state_digest(tensors)}
    path.write_bytes(save(tensors, metadata={**meta, "sha256": _digest(meta, tensors)}))
    return path


@pytest.mark.parametrize("info, match", [
    ("[1,2]", "JSON object"),
    ({"step": None}, "info.step"),
    ({"step": -1}, "info.step"),
    ({"step": "abc"}, "info.step"),
    ({"stamp_ns": 1e30}, "info.stamp_ns"),
    ({"stamp_ns": -5}, "info.stamp_ns"),
    ({"stamp_ns": 2**62}, "info.stamp_ns"),  # past a ROS Time's int32 seconds: list_capsules could not send it
    ({"label": ["x"]}, "info.label"),
    ({"label": "y" * 300}, "info.label"),
    ({"step": 29}, "does not match meta"),
])
def test_crafted_metadata_with_a_valid_checksum_is_refused(stepped, tmp_path, info, match):
    path = craft(tmp_path / "c.safetensors", stepped, info=info)
    refused(stepped, lambda: stepped.import_capsule(path, restore=True), match)


@pytest.mark.parametrize("field, value, match", [
    (META_KV_LEN, -1, "kv_len"),
    (META_KV_LEN, 10**6, "kv_len"),
    (META_POS, -3, "position"),
    (META_STEP, 31, "step"),
    (6, 1, "reserved"),
])
def test_crafted_meta_with_a_valid_checksum_is_refused(stepped, tmp_path, field, value, match):
    meta = stepped.materialize(stepped.live_capsule_id)["meta"].copy()
    meta[field] = value
    path = craft(tmp_path / "c.safetensors", stepped, tensors={"meta": meta})
    refused(stepped, lambda: stepped.import_capsule(path, restore=True), match)


@pytest.mark.parametrize("header, match", [
    (b'{"__metadata__": ["x"]}', "not a mapping"),
    (b'["x"]', "unreadable"),
    (b"[" * 100_000 + b"]" * 100_000, "unreadable"),  # nested past the interpreter's stack
], ids=["metadata_a_list", "header_a_list", "nested_100k_deep"])
def test_a_malformed_header_is_refused_as_corrupt(stepped, tmp_path, header, match):
    path = tmp_path / "c.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    refused(stepped, lambda: stepped.import_capsule(path, restore=True), match)


def test_stamps_before_1970_or_past_a_ros_time_are_refused_by_step_and_snapshot(stepped):
    from flashrt_ros.runtime.state.capsule_file import MAX_STAMP_NS
    o = observation_trace(1)[0]
    for bad in (-1, MAX_STAMP_NS + 1, 1.5):
        assert_refused_unchanged(stepped, lambda b=bad: stepped.step(o, b), ValueError, "stamp_ns")
        assert_refused_unchanged(stepped, lambda b=bad: stepped.snapshot(stamp_ns=b), ValueError, "stamp_ns")
    assert stepped.step(o, MAX_STAMP_NS).capsule_id  # the last ROS Time is a stamp like any other
    assert stepped.capsule_info(stepped.live_capsule_id).stamp_ns == MAX_STAMP_NS


def test_a_state_full_of_nan_is_refused(stepped, tmp_path):
    k = stepped.materialize(stepped.live_capsule_id)["k_cache.0"].copy()
    k[3, 1] = np.nan
    path = craft(tmp_path / "c.safetensors", stepped, tensors={"k_cache.0": k})
    refused(stepped, lambda: stepped.import_capsule(path, restore=True), "non-finite")


def test_metadata_edited_after_export_breaks_the_checksum(stepped, tmp_path):
    path = tmp_path / "c.safetensors"
    stepped.export_capsule(0, path)
    raw = path.read_bytes()
    edited = raw.replace(b'\\"label\\": \\"\\"', b'\\"label\\": \\"X\\"', 1)
    assert edited != raw
    header_len = int.from_bytes(raw[:8], "little") + len(edited) - len(raw)
    path.write_bytes(header_len.to_bytes(8, "little") + edited[8:])
    refused(stepped, lambda: stepped.import_capsule(path, restore=True), "checksum")


def test_a_format_1_file_is_refused_naming_the_format(stepped, tmp_path):
    path = craft(tmp_path / "c.safetensors", stepped, fmt="flashrt-capsule/1")
    refused(stepped, lambda: stepped.import_capsule(path), "flashrt-capsule/1.*re-export")


def test_oversized_files_and_fifos_are_refused_without_reading_them(stepped, tmp_path):
    big = tmp_path / "big.safetensors"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB that would take seconds and RAM to read
    refused(stepped, lambda: stepped.import_capsule(big), "larger than a capsule")
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    refused(stepped, lambda: stepped.import_capsule(fifo), "not a regular file")


def test_a_thousand_failed_imports_take_nothing_and_the_live_step_still_takes_capsules(stepped, tmp_path):
    path = craft(tmp_path / "c.safetensors", stepped, info={"step": "abc"})
    used = stepped.store_usage()
    for _ in range(1000):
        with pytest.raises(CorruptCapsule):
            stepped.import_capsule(path)
    assert stepped.store_usage() == used
    assert stepped.step(observation_trace(31)[30]).capsule_id == stepped.live_capsule_id > 0


def test_a_failed_export_leaves_no_temporary_file(stepped, tmp_path):
    target = tmp_path / ("n" * 300 + ".safetensors")  # ENAMETOOLONG
    with pytest.raises(OSError):
        stepped.export_capsule(0, target)
    assert list(tmp_path.iterdir()) == []


def test_a_name_with_a_nul_is_refused_on_export_and_import_and_nothing_is_written(stepped, tmp_path):
    for fn in (lambda: stepped.export_capsule(0, tmp_path / "short\x00long.safetensors"),
               lambda: stepped.import_capsule(tmp_path / "short\x00long.safetensors")):
        assert_refused_unchanged(stepped, fn, ValueError, "NUL character")
    assert list(tmp_path.iterdir()) == []


def test_the_temporaries_of_dead_exports_are_swept_and_those_of_live_processes_kept(tmp_path):
    import subprocess
    import sys

    from flashrt_ros.runtime.state.capsule_file import sweep_stale_temporaries

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".grasp.safetensors.{dead.pid}.tmp"
    mine = tmp_path / f".other.safetensors.{os.getppid()}.tmp"  # a live process (the test runner's parent)
    keep = [tmp_path / "grasp.safetensors", tmp_path / ".hidden.tmp", tmp_path / f".x.{dead.pid}.tmp.bak"]
    for p in [stale, mine, *keep]:
        p.write_bytes(b"x")
    os.symlink(tmp_path / "grasp.safetensors", tmp_path / f".link.{dead.pid}.tmp")  # not a regular file
    assert sweep_stale_temporaries(tmp_path) == [stale]
    assert not stale.exists() and mine.exists() and all(p.exists() for p in keep)
