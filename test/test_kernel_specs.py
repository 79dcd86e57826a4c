"""One spec per kernel (runtime/model/kernel_spec.py): every extern "C" signature in kernels/*.cu is the one
its spec generates (types, const-ness, names, order), every twin takes its spec's parameters, and the
constants shared by Python and CUDA are defined once, in Python, never copied into a .cu file."""
import re
from pathlib import Path

import numpy as np
import pytest

from flashrt_ros.runtime.engine.launch_table import kernel_dir
from flashrt_ros.runtime.model import kernels as K
from flashrt_ros.runtime.model.kernel_spec import CUDA_CONSTANTS, SPECS, cuda_defines

_FN = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)\s*\(([^)]*)\)')


def cu_signatures() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """function -> (source, [(C type, name)]) parsed from kernels/*.cu."""
    out = {}
    for src in sorted(kernel_dir().glob("*.cu")):
        for name, params in _FN.findall(src.read_text()):
            sig = []
            for p in params.split(","):
                words = p.replace("__restrict__", " ").replace("*", " * ").split()
                sig.append(("".join(w if w == "*" else " " + w for w in words[:-1]).strip().replace(" *", "*"),
                            words[-1]))
            out[name] = (src.name, sig)
    return out


SPEC_FNS = {fn.name: (spec, fn) for spec in SPECS.values() for fn in spec.cuda}


def test_every_cuda_function_has_a_spec_and_every_spec_a_cuda_function():
    assert set(cu_signatures()) == set(SPEC_FNS)


@pytest.mark.parametrize("function", sorted(SPEC_FNS))
def test_cu_signature_is_the_one_its_spec_generates(function):
    spec, fn = SPEC_FNS[function]
    source, got = cu_signatures()[function]
    assert source == fn.source
    assert got == spec.c_signature(fn), f"{source}: {function} differs from kernel_spec {spec.name!r}"


def test_every_plan_kernel_twin_takes_its_spec_parameters():
    for name, k in K.REGISTRY.items():
        code = k.ref.__code__
        assert code.co_varnames[:code.co_argcount] == SPECS[name].params + k.consts


def test_shared_constants_are_never_defined_in_the_cuda_sources():
    for src in kernel_dir().glob("*.c*"):
        for name in CUDA_CONSTANTS:
            assert not re.search(rf"#\s*define\s+{name}\b", src.read_text()), f"{src.name} redefines {name}"
    flags = dict(f[2:].split("=", 1) for f in cuda_defines())
    assert set(flags) == set(CUDA_CONSTANTS)
    assert np.float32(float(flags["RMS_EPS"].strip("()f"))) == K.RMS_EPS


def test_shared_constants_are_assigned_in_one_python_module():
    root = Path(K.__file__).resolve().parents[2]  # flashrt_ros/
    pattern = re.compile(rf"^\s*(?:{'|'.join(CUDA_CONSTANTS)})(?:\s*,\s*\w+)*\s*=(?!=)", re.M)  # an assignment
    owners = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if pattern.search(p.read_text()))
    assert owners == ["runtime/model/kernel_spec.py"]


def test_twin_arguments_are_checked_against_the_spec_at_bind():
    spec = SPECS["linear"]
    x, w, b = np.zeros((2, 4), np.float32), np.zeros((4, 3), np.float32), np.zeros(3, np.float32)
    assert spec.bind((x, w, b, np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)), {"act": 0}) \
        == {"act": 0, "B": 2, "n_in": 4, "n_out": 3}
    with pytest.raises(ValueError, match=r"linear shapes: y must be \[B=2, n_out=3\], got \(2, 5\)"):
        spec.bind((x, w, b, np.zeros((2, 5), np.float32), np.zeros((2, 3), np.float32)), {"act": 0})
    with pytest.raises(ValueError, match="bias must be float32, got float64"):
        spec.bind((x, w, b.astype(np.float64), np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)), {})
