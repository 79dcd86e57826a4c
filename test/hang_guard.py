"""A test that hangs ends the whole run, with every thread's Python stack on stderr, instead of sitting until
CI's limit. A Fast DDS 3.2 deadlock (eProsima/Fast-DDS#6502, docs/notes.md) hung one `make test` that way:
no Python code can break it, so the guard exits the process (faulthandler's watchdog thread still runs)."""
from __future__ import annotations

import faulthandler
import os

import pytest

# the longest tests (the quick benches, 20 kills of a node) take up to a minute; the suite ~12 min on 2 cores
HANG_LIMIT_S = float(os.environ.get("FLASHRT_TEST_HANG_LIMIT_S", "900"))
_stderr = None  # the terminal's stderr: during a test pytest points fd 2 at a capture file, lost at exit


def pytest_configure(config):
    global _stderr
    _stderr = os.fdopen(os.dup(2), "w")  # pytest's capture is suspended here: fd 2 is the real stderr


@pytest.fixture(autouse=True)
def hang_guard():
    faulthandler.dump_traceback_later(HANG_LIMIT_S, exit=True, file=_stderr)
    yield
    faulthandler.cancel_dump_traceback_later()
