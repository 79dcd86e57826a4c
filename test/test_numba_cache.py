"""The compiled CPU step's on-disk cache is keyed by every source compiled into it: numba keys a cached
function on its own file only, so without the key an edit to cpu_attention.py alone ran the old attention."""
import re
import shutil

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
