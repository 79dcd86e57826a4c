"""keep_freed_memory: a 4 MiB block freed and allocated again reuses its pages (no new page faults), as the
capsule stream's keyframes do once per keyframe; without it glibc maps fresh pages each time."""
from __future__ import annotations

import subprocess
import sys

import pytest

from flashrt_ros.ros.platform.freed_memory import keep_freed_memory

PROBE = """
import resource, sys
if sys.argv[1] == "keep":
    from flashrt_ros.ros.platform.freed_memory import keep_freed_memory
    print(keep_freed_memory(), file=sys.stderr)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = bytearray(4 << 20)  # a keyframe's buffer (bytearray touches it: zero-filled)
del block
before = faults()
block = bytearray(4 << 20)  # the next keyframe's
print(faults() - before)
"""


def faults_of_a_reallocation(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_keyframe_buffer_is_reused_without_faulting_its_pages_in_again():
    pages = (4 << 20) // 4096
    assert faults_of_a_reallocation("default") >= pages // 2  # glibc's defaults: its pages faulted in again
    assert faults_of_a_reallocation("keep") < pages // 8


def test_the_log_line_says_what_was_set():
    line = keep_freed_memory()
    assert line.startswith("freed memory:") and ("32 MiB" in line or "defaults" in line)
