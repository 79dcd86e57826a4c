"""The suite's hang guard (hang_guard.py): a test that hangs past the limit ends the run with a nonzero status
and every thread's stack, instead of holding CI until its own limit; a test under the limit is untouched."""
import os
import subprocess
import sys
import time
from pathlib import Path

TEST_DIR = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TEST_DIR)!r})
from hang_guard import hang_guard, pytest_configure  # noqa: F401
"""
TESTS = """
import threading
import time


def test_quick():
    time.sleep(0.1)


def test_hangs_in_a_lock_no_signal_breaks():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
"""


def _run(tmp_path, limit_s, select):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_target.py").write_text(TESTS)
    env = dict(os.environ, FLASHRT_TEST_HANG_LIMIT_S=str(limit_s))
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select,
                          str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return res, time.monotonic() - t0


def test_a_hung_test_ends_the_run_with_its_stack_after_the_limit(tmp_path):
    res, took = _run(tmp_path, 2, "quick or hangs")
    assert res.returncode != 0
    assert "Timeout" in res.stderr and "test_hangs_in_a_lock_no_signal_breaks" in res.stderr, res.stderr[-2000:]
    assert took < 60


def test_a_test_under_the_limit_passes_untouched(tmp_path):
    res, _ = _run(tmp_path, 2, "quick")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "1 passed" in res.stdout
