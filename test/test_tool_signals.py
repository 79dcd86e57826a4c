"""A tool's SIGTERM (tools/common.sigterm_as_interrupt) ends it even when the signal lands inside a finaliser,
where an exception is printed and dropped: flashrt-bench stream once ran on and exited 0 after a SIGTERM that
arrived during rclpy's Future.__del__."""
import signal
import subprocess
import sys

from conftest import ROOT

SIGTERM_IN_A_FINALISER = r"""
import os, signal, sys, time
from flashrt_ros.tools.common import Terminated, sigterm_as_interrupt
sigterm_as_interrupt()
class Finaliser:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10000):  # the handler runs here, inside __del__
            pass
try:
    Finaliser()
    time.sleep(10)
    print("ran on")
    sys.exit(0)
except Terminated as e:
    sys.exit(128 + e.signum)
"""


def test_a_sigterm_inside_a_finaliser_still_ends_the_tool():
    res = subprocess.run([sys.executable, "-c", SIGTERM_IN_A_FINALISER], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 128 + signal.SIGTERM, (res.stdout, res.stderr)
    assert "ran on" not in res.stdout and "Exception ignored" not in res.stderr, res.stderr
