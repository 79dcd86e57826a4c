"""The compiled CPU step's on-disk cache is keyed by every source compiled into it: numba keys a cached
function on its own file only, so without the key an edit to cpu_attention.py alone ran the old attention."""
import os
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("numba")
from flashrt_ros.runtime.engine import cpu_attention, cpu_kernels, cpu_linear, cpu_program, numba_cache  # noqa: E402

ENGINE = numba_cache._ENGINE


def test_every_compiled_function_caches_under_the_directory_keyed_by_the_sources():
    assert numba_cache.CACHE_DIR.name == numba_cache.source_key()
    for fn in (cpu_kernels.run_program, cpu_linear.gemv_rows, cpu_attention.attn_decode, cpu_program._f):
        assert fn._cache._cache_path.startswith(str(numba_cache.CACHE_DIR)), fn


def test_every_engine_module_that_compiles_code_is_in_the_key():
    package = ENGINE.parents[1]
    compiling = {p.name for p in package.rglob("*.py") if re.search(r"^@(njit|intrinsic)\b", p.read_text(), re.M)}
    keyed = {p.name for p in numba_cache.SOURCES}
    assert compiling and compiling <= keyed, compiling - keyed
    assert "kernel_spec.py" in keyed  # its constants are compiled in


def test_an_edit_to_any_compiled_source_changes_the_key(tmp_path):
    copies = []
    for src in numba_cache.SOURCES:
        dst = tmp_path / src.name
        shutil.copyfile(src, dst)
        copies.append(dst)
    key = numba_cache.source_key(copies)
    assert key == numba_cache.source_key()
    for path in copies:
        original = path.read_bytes()
        path.write_bytes(original + b"\n# edited\n")
        assert numba_cache.source_key(copies) != key, path.name
        path.write_bytes(original)
    assert numba_cache.source_key(copies) == key


# ---- a cache another user can write is not read (issue 44.4): numba unpickles its index files, so a planted
# index is code run inside the node

PLANTED = """
import os, pickle, sys
class Payload:
    def __reduce__(self):
        return (open, (sys.argv[1], "w"))  # creates the marker file when unpickled
sys.stdout.buffer.write(pickle.dumps(Payload()))
"""

USER = """
import sys
from flashrt_ros.runtime.engine import numba_cache
sys.path.insert(0, sys.argv[1])
import planted_mod
assert planted_mod.f(1) == 2
print(numba_cache.CACHE_DIR)
"""


def _run(code, *args, env):
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=120)


def _cache_with_a_planted_index(tmp_path):
    """A cache root whose keyed directory holds numba's index of planted_mod.f overwritten by a pickle that
    creates tmp_path/ran when loaded; returns (env, the module's folder, the index, the marker)."""
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "planted_mod.py").write_text("from numba import njit\n\n\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    root = tmp_path / "cache"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(root)}
    first = _run(USER, mod, env=env)
    assert first.returncode == 0, first.stderr
    index = next(root.rglob("planted_mod.f-*.nbi"))
    marker = tmp_path / "ran"
    index.write_bytes(subprocess.run([sys.executable, "-c", PLANTED, str(marker)], capture_output=True,
                                     check=True).stdout)
    return env, mod, index, marker


def test_a_planted_index_in_a_cache_others_can_write_never_runs(tmp_path):
    env, mod, index, marker = _cache_with_a_planted_index(tmp_path)
    keyed = index.parent.parent
    keyed.chmod(0o777)  # another local user could have put the index there
    run = _run(USER, mod, env=env)
    assert run.returncode == 0, run.stderr
    assert not marker.exists(), "the planted index was unpickled"
    assert f"numba cache {keyed} not used: {keyed} is writable by every user" in run.stderr
    assert not run.stdout.strip().startswith(str(tmp_path)), run.stdout  # compiled elsewhere


def test_the_planted_index_does_run_from_a_trusted_cache(tmp_path):
    """The planting works: with the directory private, numba reads the index (the check above is real)."""
    env, mod, index, marker = _cache_with_a_planted_index(tmp_path)
    run = _run(USER, mod, env=env)
    assert run.returncode == 0, run.stderr
    assert marker.exists()
    assert "not used" not in run.stderr


def test_a_cache_root_under_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: another user could rename the root away and put theirs in its place
    assert numba_cache.check_cache_dir(shared / "cache" / "key") == f"{shared} is writable by every user"
    shared.chmod(0o1777)  # sticky, like /tmp: only the owner renames
    assert numba_cache.check_cache_dir(shared / "cache" / "key") == ""


def test_an_index_owned_by_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to give a file to another user")
    keyed = tmp_path / "key"
    assert numba_cache.check_cache_dir(keyed) == ""
    assert keyed.stat().st_mode & 0o777 == 0o700
    planted = keyed / "sub" / "x.nbi"
    planted.parent.mkdir()
    planted.write_bytes(b"")
    os.chown(planted, 65534, 65534)
    assert numba_cache.check_cache_dir(keyed) == f"{planted} belongs to user 65534, not 0"
    planted.unlink()
    (keyed / "link").symlink_to("/etc")
    assert "is not a plain file or directory" in numba_cache.check_cache_dir(keyed)
